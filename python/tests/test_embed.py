"""``LLM.embed``: pooled vectors of the real model, shaped as vLLM's ``EmbeddingRequestOutput``;
the pooling parameters act as documented; a bad one is refused without stopping the engine. (The
vectors themselves are checked against transformers in the Rust suite, on every family.)"""

import math

import pytest

from paged_llm import EmbeddingRequestOutput, InvalidRequestError, PoolingParams


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def test_embed_pools_normalises_and_cuts_as_asked(llm):
    texts = ["Paged attention keeps the KV cache in blocks.", "The capital of France is Paris."]
    out = llm.embed(texts)
    assert [type(o) for o in out] == [EmbeddingRequestOutput] * 2
    assert [o.prompt_token_ids for o in out] == [llm.tokenize(t) for t in texts]
    first, second = (o.outputs.embedding for o in out)
    assert len(first) == 576 and abs(norm(first) - 1) < 1e-5 and first != second
    # Alone or in a batch: the same vector.
    alone = llm.embed(texts[0])[0].outputs.embedding
    assert max(abs(a - b) for a, b in zip(alone, first)) < 1e-5
    raw = llm.embed(texts[0], PoolingParams(normalize=False))[0].outputs.embedding
    assert max(abs(r / norm(raw) - f) for r, f in zip(raw, first)) < 1e-5
    cut = llm.embed(texts[0], PoolingParams(dimensions=8))[0].outputs.embedding
    want = [r / norm(raw[:8]) for r in raw[:8]]
    assert len(cut) == 8 and max(abs(c - w) for c, w in zip(cut, want)) < 1e-5
    mean = llm.embed(texts[0], PoolingParams(pooling_type="mean"))[0].outputs.embedding
    assert abs(norm(mean) - 1) < 1e-5 and mean != first


def test_bad_pooling_is_refused_and_the_engine_keeps_serving(llm):
    with pytest.raises(InvalidRequestError, match="dimensions"):
        llm.embed("hello", PoolingParams(dimensions=100_000))
    with pytest.raises(ValueError, match="pooling"):
        llm.embed("hello", PoolingParams(pooling_type="CLS"))
    assert len(llm.embed("hello")[0].outputs.embedding) == 576
    assert llm._engine.kv_is_idle()
