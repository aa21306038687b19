"""Multimodal inputs: which modalities pagedkv's models take, and how an image becomes rows of
the language model's input.

A model without an encoder for a modality refuses its inputs by name (a ValueError; 400 in the
server) instead of dropping them and answering the text as if the image had never been sent.
A model that has one lists its modalities in ``SUPPORTED_MODALITIES``. LLaVA-1.5, LLaVA-NeXT
(models/llava.py, llava_next.py) and Qwen2-VL (models/qwen2_vl.py) take images:
ImageInputProcessor runs the checkpoint's HF processor on a prompt's images and expands each
image token into as many placeholders as the model makes rows of that image (as HF's processor
does); the engine runs the vision tower once per request at admission and keeps the rows on the
request (MultiModalInputs); each prefill chunk's input embeddings take them at the placeholders'
positions (step_image_rows). A model with M-RoPE (Qwen2-VL) also gets the prompt's 3-component
positions at admission (engine/mrope_positions.py).

What such a model class provides: ``image_token_id``; ``load_image_processor(folder)``;
``image_inputs(processor, images) -> (encoder inputs, rows per image)`` (the HF processor's
tensors, e.g. pixel_values and image_sizes / image_grid_thw); ``encode_images(**encoder
inputs) -> [rows, hidden]`` in prompt order; ``chat_image_ids()``, the tokens a chat image part
becomes; and with M-RoPE ``mrope_positions(ids, encoder inputs)``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

# Architecture name -> the modalities its prompts may carry besides text.
SUPPORTED_MODALITIES: Dict[str, FrozenSet[str]] = {
    "LlavaForConditionalGeneration": frozenset({"image"}),
    "LlavaNextForConditionalGeneration": frozenset({"image"}),
    "Qwen2VLForConditionalGeneration": frozenset({"image"}),
}
# vLLM's default limit_mm_per_prompt of a modality the engine argument leaves out.
DEFAULT_MM_LIMIT = 999

# vLLM's prompt-dict keys that carry or configure non-text inputs.
MULTIMODAL_PROMPT_KEYS = ("multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids")

# OpenAI / vLLM chat content-part types -> the modality they carry.
CHAT_PART_MODALITIES = {
    "image_url": "image",
    "image_embeds": "image",
    "image_pil": "image",
    "input_image": "image",
    "input_audio": "audio",
    "audio_url": "audio",
    "video_url": "video",
    "file": "file",
    "input_file": "file",
}


class UnsupportedModalityError(ValueError):
    """An input of a modality the loaded model cannot read."""


def model_modalities(architecture: Optional[str]) -> FrozenSet[str]:
    return SUPPORTED_MODALITIES.get(architecture or "", frozenset())


def _refusal(where: str, modality: str, architecture: Optional[str]) -> UnsupportedModalityError:
    model = f"the model ({architecture})" if architecture else "the model"
    return UnsupportedModalityError(
        f"{where}: {modality} inputs are not supported: {model} takes text only "
        f"(pagedkv has no {modality} encoder for it)"
    )


def check_prompt_modalities(
    item: Mapping[str, Any], name: str, architecture: Optional[str] = None
) -> None:
    """Refuses a prompt dict's ``multi_modal_data`` (and its companion keys) unless the model
    reads every modality it holds."""
    supported = model_modalities(architecture)
    data = item.get("multi_modal_data")
    if data is not None:
        if not isinstance(data, Mapping):
            raise TypeError(
                f"{name}['multi_modal_data'] must be a dict of modality -> data, "
                f"got {type(data).__name__}"
            )
        for modality in data:
            if modality not in supported:
                raise _refusal(
                    f"{name}['multi_modal_data'][{modality!r}]", str(modality), architecture
                )
    for key in MULTIMODAL_PROMPT_KEYS:
        if key in item and item[key] is not None and not supported:
            raise _refusal(f"{name}[{key!r}]", "multimodal", architecture)
        if key != "multi_modal_data" and item.get(key) is not None:
            raise ValueError(f"{name}[{key!r}] is not supported (pagedkv takes multi_modal_data)")


def check_chat_part(part_type: Any, where: str, architecture: Optional[str] = None) -> None:
    """Refuses a chat content part of a modality the model cannot read (by name); text parts
    and unknown types are the caller's to judge."""
    modality = CHAT_PART_MODALITIES.get(part_type) if isinstance(part_type, str) else None
    if modality is not None and modality not in model_modalities(architecture):
        raise _refusal(f"{where} (type {part_type!r})", modality, architecture)


def check_mm_limits(limits: Any) -> None:
    """limit_mm_per_prompt: a dict of modality -> an int >= 0."""
    if not isinstance(limits, Mapping):
        raise TypeError(f"limit_mm_per_prompt must be a dict, got {type(limits).__name__}")
    for modality, n in limits.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"limit_mm_per_prompt[{modality!r}] must be an int >= 0, got {n!r}")


# ---------------------------------------------------------------------- images
@dataclass
class MultiModalInputs:
    """A request's images, ready for the engine."""

    # The HF processor's tensors the vision tower reads (pixel_values, image_sizes, ...).
    encoder_inputs: Dict[str, torch.Tensor]
    # Prompt index of each placeholder token, in order: row k of ``embeds`` goes there.
    placeholders: np.ndarray
    content_hash: str  # of the images' pixels: the prefix cache's salt
    embeds: Optional[torch.Tensor] = None  # [num placeholders, hidden], set at admission
    # M-RoPE models: the prompt's (temporal, height, width) positions [3, prompt length] and
    # the shift of every later position (max position + 1 - prompt length).
    mrope_positions: Optional[np.ndarray] = None
    mrope_delta: int = 0

    @property
    def cache_salt(self) -> str:
        return f"mm:{self.content_hash}"


class ImageInputProcessor:
    """The checkpoint's HF processor (model.load_image_processor: its image processor and
    token counts) and the model's image-token rule. Built from the model folder; runs off the
    engine thread with the rest of the InputProcessor."""

    def __init__(self, model_dir: str, model: Any, limits: Optional[Mapping[str, int]]):
        self.model = model
        self.processor = model.load_image_processor(model_dir)
        self.image_token_id = int(model.image_token_id)
        # The tokens a chat image part becomes (the image token; Qwen2-VL: with its brackets).
        self.chat_image_ids = [int(t) for t in model.chat_image_ids()]
        self.max_images = int((limits or {}).get("image", DEFAULT_MM_LIMIT))

    def chat_image_text(self, tokenizer: Any) -> str:
        """The text of chat_image_ids (what a chat image part reads as in the template)."""
        return "".join(tokenizer.hf.convert_ids_to_tokens(self.chat_image_ids))

    def process(
        self,
        ids: List[int],
        data: Mapping[str, Any],
        name: str,
        max_pixels: Optional[int] = None,
    ) -> Tuple[List[int], MultiModalInputs]:
        """Token ids with the k-th image token expanded into image k's placeholders (ids
        already expanded are kept), and what the vision tower reads. ``max_pixels``: the most
        pixels of one image (RequestLimits.max_image_pixels), None for no limit."""
        images = data.get("image")
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        where = f"{name}['multi_modal_data']['image']"
        if not images:
            raise ValueError(f"{where} is empty")
        if len(images) > self.max_images:
            raise ValueError(
                f"{where}: {len(images)} images, more than limit_mm_per_prompt allows "
                f"({self.max_images})"
            )
        for i, image in enumerate(images):  # (before the processor resizes a huge one)
            check_image_pixels(getattr(image, "size", None), max_pixels, f"{where}[{i}]")
        inputs, counts = self._process(_rgb(images, where), where)
        ids = self._expand(ids, counts, name)
        placeholders = np.flatnonzero(np.asarray(ids) == self.image_token_id)
        digest = hashlib.sha256()
        for key in sorted(inputs):
            digest.update(key.encode())
            digest.update(inputs[key].contiguous().numpy().tobytes())
        mm = MultiModalInputs(inputs, placeholders, digest.hexdigest()[:32])
        if hasattr(self.model, "mrope_positions"):
            mm.mrope_positions, mm.mrope_delta = self.model.mrope_positions(np.asarray(ids), inputs)
        return ids, mm

    def _process(self, images: List[Any], where: str) -> Tuple[Dict[str, Any], List[int]]:
        """The model's processor over the prompt's images; a refusal (a shape the model
        cannot take: Qwen2-VL's aspect ratios above 200, ...) names the image."""
        try:
            return self.model.image_inputs(self.processor, images)
        except ValueError as exc:
            which = _culprit(self.model, self.processor, images) if len(images) > 1 else "[0]"
            raise ValueError(f"{where}{which}: the image processor refused it: {exc}") from exc

    def _expand(self, ids: List[int], counts: Sequence[int], name: str) -> List[int]:
        tok, total = self.image_token_id, sum(counts)
        found = ids.count(tok)
        if found == total and total != len(counts):
            return ids  # already expanded (a prompt built from an earlier expansion)
        if found != len(counts):
            raise ValueError(
                f"{name}: the prompt has {found} image tokens (id {tok}) for {len(counts)} "
                "image(s); put one image token where each image goes"
            )
        out: List[int] = []
        k = 0
        for t in ids:
            if t == tok:
                out.extend([tok] * counts[k])
                k += 1
            else:
                out.append(t)
        return out


MAX_IMAGE_BYTES = 20 << 20  # one fetched or decoded image


def check_image_pixels(size: Any, max_pixels: Optional[int], where: str) -> None:
    """An image of ``size`` (width, height) within ``max_pixels`` (None: no limit). A few
    kilobytes of PNG can hold a 8000 x 8000 image that takes seconds to decode and resize."""
    if max_pixels is None or size is None:
        return
    width, height = (int(v) for v in size)
    if width * height > max_pixels:
        raise ValueError(
            f"{where}: the image is {width}x{height} = {width * height} pixels, more than "
            f"max_image_pixels ({max_pixels}) allows"
        )


def load_image_url(
    url: Any,
    where: str,
    allowed_domains: Optional[Sequence[str]] = None,
    max_pixels: Optional[int] = None,
    local_media_path: Optional[str] = None,
) -> Any:
    """An OpenAI ``image_url`` -> PIL.Image: a ``data:`` URL (base64) always; an http(s) URL
    only from a host in ``allowed_domains`` (vLLM's --allowed-media-domains: the server must
    not fetch what a client names, e.g. internal addresses); a file:// URL only under
    ``local_media_path`` (vLLM's --allowed-local-media-path); any other scheme is refused.
    An image over ``max_pixels`` is refused from its header, before it is decoded."""
    import base64
    import binascii
    import io
    from urllib.parse import urlparse

    from PIL import Image, UnidentifiedImageError

    if not isinstance(url, str) or not url:
        raise ValueError(f"{where}: image_url.url must be a non-empty string")
    scheme = url.split(":", 1)[0].lower()
    if scheme == "data":
        head, _, payload = url.partition(",")
        if not head.endswith(";base64"):
            raise ValueError(f"{where}: a data: image URL must be base64 (data:image/...;base64,)")
        try:
            raw = base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{where}: the data: URL is not valid base64 ({exc})") from None
    elif scheme in ("http", "https"):
        host = urlparse(url).hostname or ""
        if not _allowed_host(host, allowed_domains):
            raise ValueError(
                f"{where}: fetching image URLs from {host!r} is not allowed; send the image "
                "as a data: URL or start the server with --allowed-media-domains " + host
            )
        raw = _fetch(url, where, allowed_domains or ())
    elif scheme == "file":
        raw = _read_local(url, where, local_media_path)
    else:
        raise ValueError(f"{where}: image URLs must be data:, http(s) or file: URLs, got {scheme}:")
    if len(raw) > MAX_IMAGE_BYTES:
        raise ValueError(f"{where}: the image is larger than {MAX_IMAGE_BYTES} bytes")
    try:
        image = Image.open(io.BytesIO(raw))  # (reads the header only)
    except Image.DecompressionBombError as exc:  # (PIL's own limit, far above ours)
        raise ValueError(f"{where}: {exc}") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"{where}: not a readable image ({exc})") from None
    check_image_pixels(image.size, max_pixels, where)
    try:
        image.load()
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"{where}: not a readable image ({exc})") from None
    return image


def _read_local(url: str, where: str, root: Optional[str]) -> bytes:
    """The bytes of a file:// URL's file, which must lie under ``root`` once symlinks and '..'
    are resolved. The errors name no path: a client learns nothing about files outside."""
    import os
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    if not root:
        raise ValueError(
            f"{where}: reading image files is not allowed; send the image as a data: URL or "
            "start the server with --allowed-local-media-path DIR (offline: "
            "LLM(allowed_local_media_path=DIR))"
        )
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{where}: a file: URL must name a local file (file:///path)")
    root = os.path.realpath(root)
    path = os.path.realpath(url2pathname(parsed.path))  # (url2pathname unquotes)
    if os.path.commonpath([path, root]) != root:
        raise ValueError(f"{where}: the file is outside --allowed-local-media-path")
    if not os.path.isfile(path):
        raise ValueError(f"{where}: no such image file under --allowed-local-media-path")
    try:
        with open(path, "rb") as f:
            return f.read(MAX_IMAGE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{where}: could not read the image file ({exc.strerror})") from None


def _allowed_host(host: str, allowed_domains: Optional[Sequence[str]]) -> bool:
    return host.lower() in {d.lower() for d in allowed_domains or ()}


def _fetch(url: str, where: str, allowed_domains: Sequence[str]) -> bytes:
    """GET ``url``, following redirects only to allow-listed http(s) hosts: an allowed host
    must not be a way to make the server fetch from any other (an internal address)."""
    import urllib.request
    from urllib.parse import urlparse

    class AllowListedRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(
            self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
        ) -> Any:
            target = urlparse(newurl)
            host = target.hostname or ""
            if target.scheme not in ("http", "https") or not _allowed_host(host, allowed_domains):
                fp.close()  # (urllib reads and closes it only on a followed redirect)
                raise ValueError(
                    f"{where}: the image URL answers with a redirect to {host!r}, a host not "
                    "listed by --allowed-media-domains"
                )
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    opener = urllib.request.build_opener(AllowListedRedirects)
    try:
        with opener.open(url, timeout=10) as resp:  # (allow-listed host)
            return bytes(resp.read(MAX_IMAGE_BYTES + 1))
    except OSError as exc:
        raise ValueError(f"{where}: could not fetch the image ({exc})") from None


@dataclass
class ChatImages:
    """The images of a conversation's ``image_url`` parts, gathered while its messages become
    text; each part becomes the model's image token in the text (vLLM's placement for string
    chat templates: the parts in order, joined by newlines)."""

    architecture: Optional[str]
    image_token: str
    allowed_domains: Optional[Sequence[str]] = None
    max_pixels: Optional[int] = None  # of one image (RequestLimits.max_image_pixels)
    images: Optional[List[Any]] = None
    local_media_path: Optional[str] = None  # the server's --allowed-local-media-path
    max_images: Optional[int] = None  # limit_mm_per_prompt's (ImageInputProcessor.max_images)

    def take(self, part: Any, where: str) -> str:
        """An image_url (or, offline, image_pil) part -> the text that stands for it."""
        if self.images is None:
            self.images = []
        if self.max_images is not None and len(self.images) >= self.max_images:
            # (before fetching or decoding it: a request of many parts costs no downloads)
            raise ValueError(
                f"{where}: more images than limit_mm_per_prompt allows ({self.max_images})"
            )
        if isinstance(part, Mapping) and part.get("type") == "image_pil":
            image = part.get("image_pil")
            check_image_pixels(getattr(image, "size", None), self.max_pixels, where)
            self.images.extend(_rgb([image], where))
            return self.image_token
        spec = getattr(part, "image_url", None)
        if spec is None and isinstance(part, Mapping):
            spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, Mapping) else spec
        self.images.append(
            load_image_url(url, where, self.allowed_domains, self.max_pixels, self.local_media_path)
        )
        return self.image_token


def image_input_processor(
    runner: Any, hf_config: Any, limits: Optional[Mapping[str, int]]
) -> Optional[ImageInputProcessor]:
    """The engine's ImageInputProcessor for a model that reads images, else None."""
    if "image" not in model_modalities(hf_config.architecture):
        return None
    if not hasattr(runner, "encode_images"):
        raise ValueError(
            f"{hf_config.architecture} runs in one process (tensor / pipeline parallel "
            "engines do not run vision towers yet)"
        )
    model = runner.model
    return ImageInputProcessor(model.source.directory, model, limits)


def _culprit(model: Any, processor: Any, images: Sequence[Any]) -> str:
    """``[i]`` of the first image the processor refuses alone ('' if none does alone)."""
    for i, image in enumerate(images):
        try:
            model.image_inputs(processor, [image])
        except ValueError:
            return f"[{i}]"
    return ""


def _rgb(images: Sequence[Any], where: str) -> List[Any]:
    from PIL import Image

    out = []
    for i, im in enumerate(images):
        if not isinstance(im, Image.Image):
            raise TypeError(f"{where}[{i}] must be a PIL.Image, got {type(im).__name__}")
        if im.width < 1 or im.height < 1:  # (the processors divide by the sides)
            raise ValueError(f"{where}[{i}] is an empty image ({im.width}x{im.height})")
        out.append(im.convert("RGB"))
    return out


def step_image_rows(
    plan: Any, entries: Sequence[Any]
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(rows of the step's flat batch, their image embeddings) for the placeholders the step's
    prefill chunks cover, or None when it covers none. A chunk of an entry runs the prompt
    positions positions[start] .. + its length (chunked prefill, recompute after preemption)."""
    rows: List[np.ndarray] = []
    values: List[torch.Tensor] = []
    qsl = plan.query_start_loc
    positions = plan.positions
    for i, entry in enumerate(entries):
        mm = getattr(entry[0], "mm", None) if entry is not None else None
        if mm is None:
            continue
        start, end = int(qsl[i]), int(qsl[i + 1])
        first = int(positions[start])
        hit = (mm.placeholders >= first) & (mm.placeholders < first + end - start)
        if hit.any():
            rows.append(start + mm.placeholders[hit] - first)
            values.append(mm.embeds[torch.from_numpy(np.flatnonzero(hit))])
    if not rows:
        return None
    return torch.from_numpy(np.concatenate(rows)), torch.cat(values)
