"""A policy made of a base model and a LoRA adapter (peft): the adapter's folder names its base by
location and sha256, and whatever loads it (the hf backend, so `serve-policy`, `optimize`, the
held-out check and the portability step; training; an export) fetches that base and checks it is
the one the adapter was trained on.

    <adapter>/adapter_config.json, adapter_model.safetensors   peft's files
    <adapter>/speedforge-base.json                              the base: BaseModel (location, sha256, files)
    <adapter>/tokenizer.json, ...                               the tokenizer it was trained with

    base = describe_base("s3://models/qwen-7b", folder)         # the base as training loaded it
    write_base(adapter_folder, base)
    is_adapter(folder)                                          # an adapter folder, with its base named
    model = load_adapted(folder, "bfloat16", "cuda")            # the base fetched and checked, the adapter on it
    merge_adapter(folder, "/models/merged")                     # one checkpoint folder: base + adapter merged

A base's location is what a model setting names: a store URI (fetched by its recorded files, each
checked by sha256, speedforge.store.models), a folder on this machine (each recorded file hashed
and compared), or "" for the default model (its GGUF file, hashed). Its sha256 is the content id of
its files' {path: sha256}, so two copies of one model have one sha256 wherever they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from speedforge.errors import UserError
from speedforge.extras import require
from speedforge.store.models import ADAPTER_CONFIG, MANIFEST, fetch_model, is_model_uri

BASE_FILE = "speedforge-base.json"


@dataclasses.dataclass(frozen=True)
class BaseModel:
    """The base model an adapter was trained on."""

    location: str  # a store URI, a folder, or "" (the default model)
    sha256: str  # of its files' {path: sha256}, sorted (base_sha256)
    files: dict[str, str]  # {relative path: sha256} of the files a load reads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "") -> "BaseModel":
        try:
            base = cls(str(data["location"]), str(data["sha256"]), {str(k): str(v) for k, v in data["files"].items()})
        except (KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"{where or BASE_FILE}: not a base model record ({exc})") from None
        if base.sha256 != base_sha256(base.files):
            raise UserError(f"{where or BASE_FILE}: its sha256 does not match the files it lists")
        return base

    def describe(self) -> str:
        return f"{self.location or 'the default model'} (sha256 {self.sha256[:12]})"


def base_sha256(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def local_files(folder: str, gguf_file: str | None = None) -> dict[str, str]:
    """{path: sha256} of the files a model load reads: its GGUF file alone, or every file of a
    checkpoint folder. A copy fetched from the store keeps its files' sha256 in its manifest,
    checked when it was fetched; elsewhere each file is hashed."""
    root = Path(folder)
    if gguf_file:
        return {gguf_file: file_sha256(root / gguf_file)}
    manifest = root / MANIFEST
    if manifest.is_file():
        return json.loads(manifest.read_text())
    paths = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {p.relative_to(root).as_posix(): file_sha256(p) for p in paths}


def describe_base(location: str, folder: str, gguf_file: str | None = None) -> BaseModel:
    """The record of a base model named `location`, whose files are at `folder` here."""
    files = local_files(folder, gguf_file)
    return BaseModel(location, base_sha256(files), files)


def is_adapter(folder: str | Path) -> bool:
    """A LoRA adapter folder that names its base (peft's config and speedforge's base record)."""
    root = Path(folder)
    return (root / ADAPTER_CONFIG).is_file() and (root / BASE_FILE).is_file()


def write_base(folder: str | Path, base: BaseModel) -> None:
    (Path(folder) / BASE_FILE).write_text(json.dumps(base.to_dict(), indent=1, sort_keys=True))


def read_base(folder: str | Path) -> BaseModel:
    path = Path(folder) / BASE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the adapter's base model record {path}: {exc}") from None
    return BaseModel.from_dict(data, str(path))


def base_files(base: BaseModel, cache_dir: str | None = None, store_config=None) -> tuple[str, str | None]:
    """(folder, gguf file or None) of the base here: fetched from the store by its recorded files,
    or found where it was, each file checked against the record; a base that changed since is a
    UserError naming the file."""
    from speedforge.store.base import CorruptObjectError, MissingObjectError

    if not base.location:
        from speedforge.policy.default_model import default_model_file

        path = default_model_file()
        found = {path.name: file_sha256(path)}
        _same(base, found, "the default model")
        return str(path.parent), path.name
    if is_model_uri(base.location):
        from speedforge.config import ModelsConfig

        try:
            folder = fetch_model(base.location, cache_dir or ModelsConfig().cache_dir, base.files, store_config)
        except (CorruptObjectError, MissingObjectError) as exc:
            raise UserError(
                f"the adapter's base model {base.location} changed or lost files since the adapter was trained ({exc})"
            ) from None
        gguf = [name for name in base.files if name.endswith(".gguf")]
        return folder, (gguf[0] if len(gguf) == 1 and "config.json" not in base.files else None)
    root = Path(base.location).expanduser()
    if not root.is_dir():
        raise UserError(f"the adapter's base model {base.location} is not a folder here (it was trained on that one)")
    found = {}
    for name in base.files:
        path = root / name
        found[name] = file_sha256(path) if path.is_file() else "(missing)"
    _same(base, found, base.location)
    gguf = [name for name in base.files if name.endswith(".gguf")]
    return str(root), (gguf[0] if len(gguf) == 1 and "config.json" not in base.files else None)


def _same(base: BaseModel, found: dict[str, str], where: str) -> None:
    for name, sha in base.files.items():
        if found.get(name) != sha:
            raise UserError(
                f"the adapter's base model {where} is not the one it was trained on: {name} has sha256 "
                f"{found.get(name, '(missing)')[:16]}, the adapter's record says {sha[:16]} (base sha256 "
                f"{base.sha256[:12]}); point the adapter at that base or train it again"
            )


def load_base(base: BaseModel, dtype, cache_dir: str | None = None, store_config=None):
    """The base model (transformers), checked, in `dtype`, on the CPU."""
    import transformers

    folder, gguf_file = base_files(base, cache_dir, store_config)
    transformers.logging.set_verbosity_error()
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=dtype)


def load_adapted(folder: str, dtype, trainable: bool = False, cache_dir: str | None = None, store_config=None):
    """The adapter in `folder` on its base (a peft PeftModel), on the CPU; `trainable` leaves the
    adapter's weights trainable (training goes on with it)."""
    require("train", "peft", purpose="a LoRA adapter")
    from peft import PeftModel

    model = load_base(read_base(folder), dtype, cache_dir, store_config)
    return PeftModel.from_pretrained(model, folder, is_trainable=trainable)


def merge_adapter(folder: str, out: str, dtype="auto", cache_dir: str | None = None, store_config=None) -> str:
    """One checkpoint folder at `out`: the base's weights with the adapter merged in (in `dtype`,
    "auto" the base's own), and the adapter's tokenizer; loads without peft."""
    import transformers

    merged = load_adapted(folder, dtype, cache_dir=cache_dir, store_config=store_config).merge_and_unload()
    merged.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    return out
