"""The wheel's ``paged-llm`` console script: the same program as ``cargo install --path
paged-llm`` — grouped help, a bad command line as one line with exit code 2, and ``serve``
answering openai-python on loopback until SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import openai

#: The console script pip wrote beside this interpreter.
SCRIPT = str(Path(sys.executable).parent / "paged-llm")


def test_help_is_grouped_and_a_bad_option_is_one_line_with_exit_code_2():
    top = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert top.returncode == 0, top.stderr
    assert "serve" in top.stdout and "bench" in top.stdout
    serve = subprocess.run([SCRIPT, "serve", "--help"], capture_output=True, text=True, timeout=60)
    for heading in ("ModelConfig:", "CacheConfig:", "SchedulerConfig:", "Frontend:"):
        assert heading in serve.stdout, serve.stdout
    bad = subprocess.run([SCRIPT, "serve", "--max-num-seqs", "many"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "invalid value 'many' for '--max-num-seqs" in bad.stderr


def test_serve_answers_openai_python_then_exits_0_on_sigterm(model_path: str):
    server = subprocess.Popen(
        [SCRIPT, "serve", "--model", model_path, "--port", "0", "--max-model-len", "512", "--num-kv-blocks", "64"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = None
        assert server.stderr is not None
        for line in server.stderr:
            found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if found:
                port = int(found.group(1))
                break
        assert port, "the server exited before listening"
        # Keep reading its stderr so that it never blocks on a full pipe.
        threading.Thread(target=server.stderr.read, daemon=True).start()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
        assert completion.choices[0].text and completion.usage.completion_tokens >= 1
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
