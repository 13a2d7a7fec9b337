#!/usr/bin/env python3
"""Renders every template here with every conversation in cases.json exactly as transformers'
`apply_chat_template(..., tokenize=False)` does, and writes expected.json (the Rust test
`chat_templates` in model/tests/it/ compares our minijinja rendering with it byte for byte).

Run by hand after changing a template or a case (a throwaway venv outside the repo):

    python3 -m venv /tmp/venv-chat && /tmp/venv-chat/bin/pip install "transformers==4.57.*" jinja2
    /tmp/venv-chat/bin/python model/tests/data/chat_templates/make_expected.py

Only transformers' own rendering function is called (`render_jinja_template`, which compiles the
template with `_compile_jinja_template`: sandboxed Jinja2 with trim_blocks, lstrip_blocks, the
loopcontrols extension, its `tojson`, `raise_exception` and `strftime_now`), with the special
tokens as keyword arguments the way a tokenizer passes them. No model files are read, so torch
is not needed. `strftime_now` reads a fixed clock (FIXED_NOW below, the Rust test uses the same).
"""

import datetime as _dt
import json
import pathlib

import jinja2
import transformers
from transformers.utils import chat_template_utils

HERE = pathlib.Path(__file__).resolve().parent
FIXED_NOW = _dt.datetime(2024, 7, 26, 9, 5, 0)


class _FixedClock(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


# `strftime_now` calls `datetime.now()` through the module's global: pin it.
chat_template_utils.datetime = _FixedClock


def render(template, tokens, case):
    return chat_template_utils.render_jinja_template(
        conversations=[case["messages"]],
        tools=case.get("tools"),
        documents=case.get("documents"),
        chat_template=template,
        add_generation_prompt=case["add_generation_prompt"],
        **tokens,
        **case.get("kwargs", {}),
    )[0][0]


def main():
    spec = json.loads((HERE / "cases.json").read_text())
    out = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "renders": {}}
    for name, tokens in spec["templates"].items():
        template = (HERE / f"{name}.jinja").read_text()
        results = {}
        for case in spec["cases"]:
            try:
                results[case["name"]] = {"text": render(template, tokens, case)}
            except jinja2.exceptions.TemplateError as e:
                # raise_exception raises a bare TemplateError; anything else is Jinja's own
                # error (a TypeError, an UndefinedError, ...): only the fact is compared.
                raised = type(e) is jinja2.exceptions.TemplateError
                results[case["name"]] = {"error": str(e), "raised": raised}
            except Exception as e:  # noqa: BLE001 - Python's own errors inside the template
                results[case["name"]] = {"error": f"{type(e).__name__}: {e}", "raised": False}
        out["renders"][name] = results
    text = json.dumps(out, ensure_ascii=False, indent=1) + "\n"
    (HERE / "expected.json").write_text(text)
    print(f"wrote {len(spec['templates'])} templates x {len(spec['cases'])} cases")


if __name__ == "__main__":
    main()
