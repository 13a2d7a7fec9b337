"""`/v1/embeddings` through the official `openai` package against the server on the real model.

Arguments: the server's base URL, its API key, and a JSON object of what the in-process engine
computed for the same inputs (`texts`, their `token_counts`, `last_normalized` vectors and the
`dim8` vectors of `dimensions: 8`). Prints `all ok` when every check passed.
"""

import json
import math
import sys

import openai

base, key, want = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
texts = want["texts"]
M = want["model"]


def close(got, expected, what):
    """Equal up to the engine's batch variance: the server batches a call's inputs as they reach
    the engine, and a step of at most 8 rows takes other matmul kernels than a larger one (an
    8-token prompt's vector alone and in a 3-prompt batch differ by 9e-4 relative L2 here). Another
    input's vector, or a wrong decoding, is off by order 1."""
    assert len(got) == len(expected), f"{what}: {len(got)} values, want {len(expected)}"
    diff = math.sqrt(sum((g - e) ** 2 for g, e in zip(got, expected)))
    norm = math.sqrt(sum(e * e for e in expected))
    assert diff <= 2e-3 * norm, f"{what}: relative L2 error {diff / norm:.2e}"


# The client's default: it asks for base64 and decodes the little-endian floats itself.
r = client.embeddings.create(input=texts, model=M)
assert r.object == "list" and r.model == want["model"], r
assert [d.index for d in r.data] == list(range(len(texts))), r.data
for d, expected in zip(r.data, want["last_normalized"]):
    close(d.embedding, expected, f"base64 input {d.index}")
    assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1.0) < 1e-5, "not normalised"
assert r.usage.prompt_tokens == sum(want["token_counts"]), r.usage
assert r.usage.total_tokens == r.usage.prompt_tokens, r.usage

# JSON floats, one string.
r = client.embeddings.create(input=texts[0], model=M, encoding_format="float")
close(r.data[0].embedding, want["last_normalized"][0], "float")

# Token ids, one list and a list of lists.
r = client.embeddings.create(input=want["token_ids"][0], model=M, encoding_format="float")
close(r.data[0].embedding, want["last_normalized"][0], "token ids")
r = client.embeddings.create(input=want["token_ids"], model=M, encoding_format="float")
assert len(r.data) == len(texts)

# `dimensions`: cut first, then normalised.
r = client.embeddings.create(input=texts, model=M, dimensions=8, encoding_format="float")
for d, expected in zip(r.data, want["dim8"]):
    close(d.embedding, expected, f"dimensions 8, input {d.index}")

# Errors: OpenAI's shape, the field named.
for kwargs, param in [
    ({"input": texts[0], "dimensions": 100_000}, "dimensions"),
    ({"input": texts[0], "dimensions": 0}, "dimensions"),
    ({"input": []}, "input"),
    ({"input": ""}, "prompt"),
]:
    try:
        client.embeddings.create(model=M, **kwargs)
        raise AssertionError(f"{kwargs} was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body.get("param") == param, (kwargs, e.body)
try:
    client.embeddings.create(input=texts[0], model="another-model")
    raise AssertionError("another model was accepted")
except openai.NotFoundError:
    pass
try:
    openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).embeddings.create(input="x", model=M)
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError:
    pass

# The server still answers after the errors.
r = client.embeddings.create(input=texts[1], model=M, encoding_format="float")
close(r.data[0].embedding, want["last_normalized"][1], "after the errors")
print("all ok")
