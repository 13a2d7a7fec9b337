"""Structured outputs and tool calling as the official `openai` package sees them.

Run by `server/tests/it/real_client.rs` against a server on 127.0.0.1 serving the real
SmolLM2 model: `python openai_structured.py BASE_URL`. Checks (one line each; exits non-zero
when any fails):
- `chat.completions.parse(response_format=<pydantic model>)` returns the parsed object (nested
  objects, enums, arrays, optional fields), greedy and sampled;
- 20 JSON schemas (objects, arrays with minItems/maxItems, enums, anyOf, string patterns,
  numbers with bounds, nested `$ref`s into `$defs`; `engine/tests/data/json_schemas.json`),
  each streamed and not, at temperature 0 and 1: 80 requests, every output valid under
  `jsonschema`;
- `response_format={"type": "json_object"}`, whole and streamed, greedy and sampled: a `stop`
  finish parses as a JSON object, a `length` finish (an object's contents are unbounded) is the
  start of one (completed where it was cut and closed, it parses as an object);
- a tool round trip (two function tools; `tool_choice` named, and `required` → `tool_calls`
  whose arguments validate against the tool's parameters; a `tool` message with the result →
  a text answer), whole and through the client's own stream helper.

Everything is sent at once with the async client, so the engine batches it and the script
takes about as long as its longest chain of requests. Every string and array in the schemas is
bounded, so every output fits in `max_tokens`: a truncated document would be a `length`
finish, never valid JSON.
"""

import asyncio
import enum
import json
import pathlib
import sys
import time
from typing import Annotated, List, Optional

import jsonschema
import openai
from pydantic import BaseModel, Field

BASE = sys.argv[1]
MAX_TOKENS = 160
# A free-text answer runs to its limit at worst: kept short, it is the longest chain's tail. It
# stops at its first sentence's end: the stream helper refuses a `length` finish.
ANSWER_TOKENS = 48
ANSWER_STOP = [".", "\n"]
STARTED = time.monotonic()
# Tokens generated for the schema requests (printed with the time: what the run cost).
USAGE = []


def user(text):
    # A short system turn instead of the template's default one: half the prompt to prefill.
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": text}]


def short(n):
    return {"type": "string", "maxLength": n}


# --- parse() with a pydantic model --------------------------------------------------------------

class Colour(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    city: Annotated[str, Field(max_length=24)]
    country_code: Annotated[str, Field(pattern=r"^[A-Z]{2}$")]


class Person(BaseModel):
    name: Annotated[str, Field(max_length=24)]
    age: Annotated[int, Field(ge=0, le=120)]
    favourite_colour: Colour
    hobbies: Annotated[List[Annotated[str, Field(max_length=16)]], Field(min_length=1, max_length=3)]
    address: Address
    nickname: Optional[Annotated[str, Field(max_length=16)]] = None


async def parse_person(chat, model, temperature):
    done = await chat.parse(model=model, messages=user("Describe a person who lives in Lisbon as JSON."),
                            response_format=Person, max_tokens=MAX_TOKENS, temperature=temperature, seed=7)
    msg = done.choices[0].message
    ok = (isinstance(msg.parsed, Person) and isinstance(msg.parsed.address, Address)
          and isinstance(msg.parsed.favourite_colour, Colour) and 1 <= len(msg.parsed.hobbies) <= 3)
    return [(f"parse(response_format=Person) at temperature {temperature}", ok,
             f"{done.choices[0].finish_reason} {msg.content!r}")]


# --- 20 JSON schemas, each 4 ways ---------------------------------------------------------------

# Shared with the engine's `guided` bench (its schema-compile set).
SCHEMAS = [(s["topic"], s["schema"]) for s in json.loads(
    (pathlib.Path(__file__).resolve().parents[2] / "engine/tests/data/json_schemas.json").read_text())["schemas"]]


async def one_schema(aclient, model, i, topic, schema, stream, temperature):
    fmt = {"type": "json_schema", "json_schema": {"name": f"schema_{i}", "schema": schema, "strict": True}}
    args = dict(model=model, messages=user(f"Give {topic} as JSON."), response_format=fmt,
                max_tokens=MAX_TOKENS, temperature=temperature, seed=i)
    if stream:
        text, finish = "", None
        async for chunk in await aclient.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **args):
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
            USAGE.append(chunk.usage.completion_tokens if chunk.usage else 0)
    else:
        r = await aclient.chat.completions.create(**args)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        USAGE.append(r.usage.completion_tokens)
    name = f"{topic} ({'stream' if stream else 'whole'}, T={temperature})"
    try:
        jsonschema.Draft202012Validator(schema).validate(json.loads(text))
        return [(name, True, "")]
    except (ValueError, jsonschema.ValidationError) as e:
        return [(name, False, f"finish {finish}: {text!r}: {str(e).splitlines()[0]}")]


# The value a JSON document may take where its text was cut: tried in turn, each followed by the
# closers of what is still open, until one parses.
CUT_FIXES = ["", "0", "\"", "\": null", ": null", "null", "\"\": null", "rue", "ue", "e", "alse", "lse", "se",
             "ull", "ll", "l"]


def starts_an_object(text):
    """Whether `text` is the start of a JSON object: completed where it was cut (a string, a
    number, a literal, a key awaiting its value) and closed, it parses as an object."""
    stack, in_string, escaped = [], False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append("]" if ch == "[" else "}")
        elif ch in "]}" and (not stack or stack.pop() != ch):
            return False
    if not text.startswith("{"):
        return False
    # A cut string is closed first (its escape completed), then takes whatever follows a string.
    head = text + ("\\" if escaped else "") + ('"' if in_string else "")
    for fix in CUT_FIXES:
        for candidate in (head + fix, text.rstrip().rstrip(",") + fix):
            try:
                if isinstance(json.loads(candidate + "".join(reversed(stack))), dict):
                    return True
            except ValueError:
                pass
    return False


async def one_json_object(aclient, model, stream, temperature):
    args = dict(model=model, messages=user("Give the name and age of a cat as a small JSON object."),
                response_format={"type": "json_object"}, max_tokens=MAX_TOKENS, temperature=temperature, seed=11)
    if stream:
        text, finish = "", None
        async for chunk in await aclient.chat.completions.create(stream=True, **args):
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
    else:
        r = await aclient.chat.completions.create(**args)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    name = f"json_object ({'stream' if stream else 'whole'}, T={temperature}, finish {finish})"
    if finish == "stop":
        try:
            ok = isinstance(json.loads(text), dict)
        except ValueError:
            ok = False
    else:
        # An object's contents are unbounded: cut by max_tokens, the text must still start one.
        ok = finish == "length" and starts_an_object(text)
    return [(name, ok, f"{text!r}")]


def check_starts_an_object():
    """The prefix check itself, on texts it must accept and refuse."""
    good = ['{"a": 1}', '{"a": [1, 2', '{"a": "x\\"y', '{"a', '{"a":', '{"a": 1.', '{"a": tr', '{"a": {"b": null},',
            "{"]
    bad = ['[1]', '{"a" 1}', '{"a": 1}}', 'x{', '{"a": 1] ', '{"a": nul1']
    return [("the json_object prefix check", all(map(starts_an_object, good)) and not any(map(starts_an_object, bad)),
             f"accepts {[t for t in bad if starts_an_object(t)]}, refuses {[t for t in good if not starts_an_object(t)]}")]


# --- a tool round trip --------------------------------------------------------------------------

def strict_tool(name, description, properties):
    return {"type": "function", "function": {
        "name": name, "description": description, "strict": True,
        "parameters": {"type": "object", "properties": properties, "required": list(properties),
                       "additionalProperties": False}}}


TOOLS = [
    strict_tool("get_weather", "The current weather in a city",
                {"city": short(24), "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}),
    strict_tool("get_time", "The local time in a time zone",
                {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]{1,15}/[A-Z][a-z]{1,15}$"}}),
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = user("What is the weather like in Paris right now?")
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def valid_calls(calls, want=None):
    """Each call names a tool (`want` if given) and its arguments validate against its schema."""
    if not calls:
        return False
    for call in calls:
        if call.type != "function" or call.function.name not in PARAMS or (want and call.function.name != want):
            return False
        try:
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
        except (ValueError, jsonschema.ValidationError):
            return False
    return True


def tool_messages(message):
    """The assistant's calls and a `tool` message answering each, to send back."""
    calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                           "arguments": c.function.arguments}}
             for c in message.tool_calls]
    out = [{"role": "assistant", "content": None, "tool_calls": calls}]
    out += [{"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"temperature": 18, "sky": "sunny"})}
            for c in calls]
    return out


async def tool_round_trip(aclient, chat, model, choice, streamed):
    """A forced call, then the tool's result sent back for a text answer; whole, or through the
    client's stream helper (which reassembles the `tool_calls` deltas itself)."""
    label = f"{'named' if isinstance(choice, dict) else choice} tool_choice, {'streamed' if streamed else 'whole'}"
    args = dict(model=model, tools=TOOLS, temperature=0)

    async def ask(messages, **more):
        if not streamed:
            return await aclient.chat.completions.create(messages=messages, **args, **more)
        async with chat.stream(messages=messages, **args, **more) as s:
            return await s.get_final_completion()

    called = await ask(QUESTION, tool_choice=choice, max_tokens=MAX_TOKENS)
    c = called.choices[0]
    calls = c.message.tool_calls
    ok = c.finish_reason == "tool_calls" and valid_calls(calls, "get_weather" if isinstance(choice, dict) else None)
    if ok and streamed:
        # Strict tools: the helper also parsed the arguments it reassembled.
        ok = all(x.function.parsed_arguments == json.loads(x.function.arguments) for x in calls)
    out = [(f"{label}: tool_calls whose arguments validate", ok, c)]
    if not ok:
        return out
    name = f"{label}: the tool's result → a text answer"
    try:
        answer = await ask(QUESTION + tool_messages(c.message), max_tokens=ANSWER_TOKENS, stop=ANSWER_STOP)
    except openai.LengthFinishReasonError as e:
        return out + [(name, False, f"no sentence within {ANSWER_TOKENS} tokens: {e.completion.choices[0]}")]
    a = answer.choices[0]
    out.append((name, bool(a.message.content) and not a.message.tool_calls and a.finish_reason == "stop", a))
    return out


async def main():
    async with openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300) as aclient:
        model = (await aclient.models.list()).data[0].id
        # `parse` and `stream` left `beta` in openai 1.9x; older releases have only the beta ones.
        chat = aclient.chat.completions if hasattr(aclient.chat.completions, "parse") else aclient.beta.chat.completions
        jobs = [one_schema(aclient, model, i, topic, schema, stream, temperature)
                for i, (topic, schema) in enumerate(SCHEMAS) for stream in (False, True) for temperature in (0, 1)]
        jobs += [parse_person(chat, model, t) for t in (0, 1)]
        jobs += [one_json_object(aclient, model, stream, t) for stream in (False, True) for t in (0, 1)]
        jobs += [tool_round_trip(aclient, chat, model, choice, streamed)
                 for choice in (NAMED, "required") for streamed in (False, True)]
        return [r for rs in await asyncio.gather(*jobs) for r in rs]


valid = [s for _, s in SCHEMAS if jsonschema.Draft202012Validator.check_schema(s) is None]
results = [(f"{len(SCHEMAS)} schemas, each a valid JSON schema", len(valid) == len(SCHEMAS) >= 20, "")]
results += check_starts_an_object()
results += asyncio.run(main())
for name, ok, detail in results:
    print(f"ok {name}" if ok else f"FAIL {name}: {detail}", flush=True)
failed = [name for name, ok, _ in results if not ok]
print(f"{len(results)} checks, {len(failed)} failed, {time.monotonic() - STARTED:.1f} s ({time.process_time():.1f} s "
      f"of this process's CPU time); the schema requests generated {sum(USAGE)} tokens", flush=True)
if failed:
    sys.exit(1)
print("all ok")
