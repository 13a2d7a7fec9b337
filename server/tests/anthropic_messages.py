"""`/v1/messages` through the official `anthropic` package against the server on the real model.

Arguments: the server's base URL and its API key (sent as `x-api-key`, as the SDK does). Checks
`messages.create` (text, system, stop sequences, usage, the chat endpoint's greedy answer for
the same turns), `messages.stream` (its text stream makes the final message's text), a tool
round trip (a forced call → `tool_use` block → its `tool_result` → a text answer, whole and
streamed), and the SDK's error classes for a refused field and a wrong key. Prints `all ok`
when every check passed.
"""

import sys

import anthropic
import jsonschema
import openai

base, key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
oai = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
M = oai.models.list().data[0].id

# --- text ---------------------------------------------------------------------------------------
m = client.messages.create(model=M, max_tokens=40, temperature=0, system="Answer briefly.", stop_sequences=["."],
                           messages=[{"role": "user", "content": "Name a river."}])
assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text", m
chat = oai.chat.completions.create(model=M, max_tokens=40, temperature=0, stop=["."], messages=[
    {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a river."}])
assert m.content[0].text == chat.choices[0].message.content, (m.content[0].text, chat.choices[0].message.content)
assert m.usage.input_tokens == chat.usage.prompt_tokens and m.usage.output_tokens == chat.usage.completion_tokens
assert m.stop_reason in ("end_turn", "stop_sequence", "max_tokens"), m
if m.stop_reason == "stop_sequence":
    assert m.stop_sequence == ".", m

# --- the stream helper --------------------------------------------------------------------------
with client.messages.stream(model=M, max_tokens=40, temperature=0, system="Answer briefly.", stop_sequences=["."],
                            messages=[{"role": "user", "content": "Name a river."}]) as s:
    pieces = list(s.text_stream)
    final = s.get_final_message()
assert "".join(pieces) == final.content[0].text == m.content[0].text, (pieces, final)
assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens, final

# --- a tool round trip --------------------------------------------------------------------------
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
          "required": ["city"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "The current weather in a city", "input_schema": SCHEMA}]
QUESTION = {"role": "user", "content": "What is the weather like in Paris?"}
called = client.messages.create(model=M, max_tokens=60, temperature=0, tools=TOOLS, tool_choice={"type": "any"},
                                messages=[QUESTION])
uses = [b for b in called.content if b.type == "tool_use"]
assert called.stop_reason == "tool_use" and uses and uses[0].name == "get_weather", called
jsonschema.validate(uses[0].input, SCHEMA)
result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny, 18 C"}]}
answer = client.messages.create(model=M, max_tokens=24, temperature=0, tools=TOOLS,
                                messages=[QUESTION, {"role": "assistant", "content": called.content}, result])
assert answer.content and answer.content[0].type == "text" and answer.content[0].text, answer

# Streamed: the helper rebuilds the input from the input_json_delta.
with client.messages.stream(model=M, max_tokens=60, temperature=0, tools=TOOLS, messages=[QUESTION],
                            tool_choice={"type": "tool", "name": "get_weather"}) as s:
    streamed = s.get_final_message()
streamed_uses = [b for b in streamed.content if b.type == "tool_use"]
assert streamed_uses and streamed.stop_reason == "tool_use", streamed
jsonschema.validate(streamed_uses[0].input, SCHEMA)

# --- errors in the SDK's classes ----------------------------------------------------------------
try:
    client.messages.create(model=M, max_tokens=8, messages=[QUESTION], thinking={"type": "enabled", "budget_tokens": 1024})
    raise AssertionError("thinking was accepted")
except anthropic.BadRequestError as e:
    assert "thinking" in str(e), e
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
        model=M, max_tokens=8, messages=[QUESTION])
    raise AssertionError("a wrong key was accepted")
except anthropic.AuthenticationError:
    pass

print("all ok")
