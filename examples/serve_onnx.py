"""ELMo vectors of one sentence from `elmo-cli export --format onnx`, with numpy and onnxruntime only (no torch).

    python examples/serve_onnx.py model.onnx "The cat sat on the mat ." [layers.npy]
"""
import json
import sys

import numpy as np
import onnxruntime as ort


def char_ids(tokens: list[str], width: int = 50) -> np.ndarray:
    """allennlp's batch_to_ids for one sentence, (1, tokens, width) int64 (spec: byte ids + 1, 0 = no token)."""
    ids = np.zeros((1, len(tokens), width), dtype=np.int64)
    for t, token in enumerate(tokens):
        specials = {"<S>": [256], "</S>": [257]}  # literal boundary tokens get the boundary characters
        body = specials.get(token) or list(token.encode("utf-8", "ignore")[: width - 2])
        raw = [258] + body + [259]  # begin-of-word, at most width-2 bytes, end-of-word
        ids[0, t] = np.array(raw + [260] * (width - len(raw))) + 1  # padding char 260; +1 for all
    return ids


session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
chars = json.loads(session.get_modelmeta().custom_metadata_map["elmo_cli.chars"])
assert chars["mode"] == "bytes", "this example writes byte ids; a codepoint model needs its chars.json table"
tokens = sys.argv[2].split()
layers, mask = session.run(["layers", "mask"], {"char_ids": char_ids(tokens, chars["max_characters_per_token"])})
print(f"{len(tokens)} tokens -> layers {layers.shape} (batch, L+1, tokens, 2P); top layer of {tokens[0]!r}:",
      np.round(layers[0, -1, 0, :4], 4))
if len(sys.argv) > 3:
    np.save(sys.argv[3], layers[0])
