"""llama.cpp's side of `peer_lookup` (group `peer`, run by `engine/benches/peer_lookup.rs`).

`python peer_lookup_llamacpp.py MODEL.gguf WORKLOAD.json THREADS`: llama-cpp-python's high-level
`Llama` with its prompt lookup decoding (`LlamaPromptLookupDecoding`, the workload's
`num_pred_tokens` and `max_ngram_size`) and without it, on the workload's token-id prompts one at
a time, greedy (temperature 0), at most `max_tokens` tokens each; `reps` rounds alternating the two.
Prints one JSON object: each side's output tokens per second (the median of rounds, each round's
tokens over its wall time) and the output tokens of the first round's answers, for the caller to
check that both engines answered alike.
"""

import json
import statistics
import sys
import time

import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

MODEL, WORKLOAD, THREADS = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
prompts, max_tokens = WORKLOAD["prompts"], WORKLOAD["max_tokens"]
n_ctx = max(len(p) for p in prompts) + max_tokens + 64


def model(lookup):
    draft = LlamaPromptLookupDecoding(num_pred_tokens=WORKLOAD["k"], max_ngram_size=WORKLOAD["max_ngram"]) if lookup else None
    # With a draft model llama-cpp-python keeps logits for every position, but sizes its score
    # array by the `logits_all` argument: it must be passed as True too, or a long prompt
    # overflows the array.
    return llama_cpp.Llama(model_path=MODEL, n_ctx=n_ctx, n_batch=512, n_threads=THREADS, n_threads_batch=THREADS,
                           draft_model=draft, logits_all=lookup, verbose=False)


def round_of(llm):
    tokens, answers, start = 0, [], time.perf_counter()
    for p in prompts:
        llm.reset()
        out = llm.create_completion(prompt=p, max_tokens=max_tokens, temperature=0.0, top_k=1)
        tokens += out["usage"]["completion_tokens"]
        answers.append(out["choices"][0]["text"])
    return tokens / (time.perf_counter() - start), answers


plain, lookup = model(False), model(True)
round_of(plain)  # warm-up
rates = {"plain": [], "lookup": []}
answers = {}
for r in range(WORKLOAD["reps"]):
    order = [("plain", plain), ("lookup", lookup)] if r % 2 == 0 else [("lookup", lookup), ("plain", plain)]
    for name, llm in order:
        rate, text = round_of(llm)
        rates[name].append(rate)
        answers.setdefault(name, text)
print(json.dumps({
    "lookup_tok_s": statistics.median(rates["lookup"]),
    "plain_tok_s": statistics.median(rates["plain"]),
    "lookup_rounds": rates["lookup"],
    "plain_rounds": rates["plain"],
    "same_answers": answers["lookup"] == answers["plain"],
    "llama_cpp_python": llama_cpp.__version__,
}))
