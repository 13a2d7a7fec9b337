"""`/v1/responses` through the official `openai` package against the server on the real model.

Argument: the server's base URL. Checks `client.responses.create` (text, instructions, usage,
the chat endpoint's greedy answer for the same turns), `client.responses.stream` (its deltas
make the final response's text), a tool round trip (a forced call → `function_call` item, its
result sent back through `previous_response_id` → a text answer), a `json_schema` text format,
`retrieve`, and an unsupported field as `BadRequestError`. Prints `all ok` when every check
passed.
"""

import json
import sys

import jsonschema
import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
M = client.models.list().data[0].id

# --- text ---------------------------------------------------------------------------------------
# vLLM's `stop` (passed on to the chat request) ends the answer before the output limit.
STOP = {"stop": [".", "\n"]}
r = client.responses.create(model=M, input="Name a fruit.", instructions="Answer in one word.",
                            max_output_tokens=32, temperature=0, extra_body=STOP)
assert r.object == "response" and r.status == "completed", r
assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text", r.output
assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage
chat = client.chat.completions.create(model=M, max_tokens=32, temperature=0, stop=STOP["stop"], messages=[
    {"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a fruit."}])
assert r.output_text == chat.choices[0].message.content, (r.output_text, chat.choices[0].message.content)
assert client.responses.retrieve(r.id).output_text == r.output_text

# --- the stream helper --------------------------------------------------------------------------
deltas = []
with client.responses.stream(model=M, input="Count to five.", max_output_tokens=32, temperature=0,
                             extra_body=STOP) as s:
    for event in s:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    final = s.get_final_response()
assert len(deltas) > 1 and "".join(deltas) == final.output_text, (deltas, final.output_text)
whole = client.responses.create(model=M, input="Count to five.", max_output_tokens=32, temperature=0, extra_body=STOP)
assert whole.output_text == final.output_text, (whole.output_text, final.output_text)

# --- a tool round trip --------------------------------------------------------------------------
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
          "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The current weather in a city",
          "parameters": PARAMS, "strict": True}]
called = client.responses.create(model=M, input="What is the weather like in Paris?", tools=TOOLS,
                                 tool_choice="required", max_output_tokens=60, temperature=0)
calls = [o for o in called.output if o.type == "function_call"]
assert len(calls) >= 1 and calls[0].name == "get_weather", called.output
jsonschema.validate(json.loads(calls[0].arguments), PARAMS)
answer = client.responses.create(model=M, previous_response_id=called.id, tools=TOOLS, max_output_tokens=24,
                                 temperature=0, extra_body=STOP, input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                                        "output": json.dumps({"sky": "sunny", "celsius": 18})}])
assert answer.output[0].type == "message" and answer.output_text, answer.output
assert answer.previous_response_id == called.id, answer

# The same call streamed: the helper reassembles its arguments from the deltas.
with client.responses.stream(model=M, input="What is the weather like in Paris?", tools=TOOLS,
                             tool_choice={"type": "function", "name": "get_weather"},
                             max_output_tokens=60, temperature=0) as s:
    streamed = s.get_final_response()
streamed_calls = [o for o in streamed.output if o.type == "function_call"]
assert streamed_calls and streamed_calls[0].name == "get_weather", streamed.output
jsonschema.validate(json.loads(streamed_calls[0].arguments), PARAMS)

# --- a json_schema text format ------------------------------------------------------------------
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
p = client.responses.create(model=M, input="A person as JSON.", max_output_tokens=60, temperature=0,
                            text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
jsonschema.validate(json.loads(p.output_text), PERSON)

# --- what is not done is refused ----------------------------------------------------------------
try:
    client.responses.create(model=M, input="x", reasoning={"effort": "high"})
    raise AssertionError("reasoning was accepted")
except openai.BadRequestError as e:
    assert "reasoning" in str(e), e
try:
    client.responses.create(model=M, input="x", previous_response_id="resp_missing")
    raise AssertionError("an unknown previous_response_id was accepted")
except openai.NotFoundError:
    pass

print("all ok")
