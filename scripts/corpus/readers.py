"""Documents out of a user's corpus files, one record at a time.

records(inputs, field, text_split, split) yields Record for every record of
every input, in a fixed order (inputs as given, a glob's matches sorted):
good ones carry the text, bad ones the reason, so the caller counts and
reports them instead of dropping them. Memory stays bounded: files are read
as streams (lines, Parquet row batches, Arrow record batches).

Inputs by name:
  *.jsonl, *.json, *.ndjson (+ .gz, .zst)   JSON lines, one object per line
  *.parquet                                 Parquet (needs pyarrow)
  a folder with state.json or dataset_dict.json
                                            Hugging Face datasets' save_to_disk
                                            (Arrow stream files; needs pyarrow)
  anything else                             plain text (--text-split)
"""
import glob
import gzip
import io
import json
import os
from dataclasses import dataclass

from corpus.text_tokenizers import fail


@dataclass
class Record:
    source: str  # the file
    where: str  # "line 12", "row 40", "paragraph 3", "file"
    text: str = None  # None for a bad record
    error: str = None  # why it is bad


class Progress:
    """Bytes of input consumed, for MB/s and the ETA: compressed bytes where
    the file is compressed, so the total is the files' sizes on disk."""

    def __init__(self, total):
        self.total, self.done_files, self.current = total, 0, (lambda: 0)

    def consumed(self):
        return self.done_files + self.current()


def expand(inputs):
    paths = []
    for pat in inputs:
        hits = sorted(glob.glob(pat)) or ([pat] if os.path.exists(pat) else [])
        if not hits:
            fail(f"no file or folder matches {pat!r}")
        paths += hits
    return paths


def is_hf_folder(path):
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json"))


def kind_of(path):
    if is_hf_folder(path):
        return "hf"
    if os.path.isdir(path):
        fail(f"{path}: a folder, but not a Hugging Face datasets folder (no state.json or dataset_dict.json); "
             "give its files or a glob")
    name = path.lower()
    for ext in (".gz", ".zst"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def disk_size(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def import_pyarrow(path):
    try:
        import pyarrow  # noqa: F401
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        import sys
        fail(f"{path}: reading Parquet and Hugging Face datasets folders needs pyarrow, which {sys.executable} lacks "
             "(scripts/setup.sh test installs it into .venv-hf: run this script with .venv-hf/bin/python, or "
             "pip install pyarrow)")
    return pyarrow


def open_compressed(path):
    raw = open(path, "rb")
    if path.lower().endswith(".gz"):
        return raw, gzip.GzipFile(fileobj=raw)
    if path.lower().endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            fail(f"{path}: .zst input needs the zstandard module: apt-get install python3-zstandard "
                 "(scripts/setup.sh test installs it)")
        return raw, zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw, raw


def text_of(obj, field, check=None):
    """The record's text (or, with `check`, what check makes of the field's
    value) or the reason it has none."""
    if not isinstance(obj, dict):
        return None, f"a JSON {type(obj).__name__}, not an object"
    if field not in obj:
        return None, f"missing field '{field}'" + (f" (fields: {', '.join(list(obj)[:8])})" if obj else "")
    value = obj[field]
    if value is None:
        return None, f"field '{field}' is null"
    if check is not None:
        return check(value)
    if not isinstance(value, str):
        return None, f"field '{field}' is {type(value).__name__}, not a string"
    if not value.strip():
        return None, f"empty text in field '{field}'"
    return value, None


def jsonl_records(path, field, progress, check):
    raw, stream = open_compressed(path)
    progress.current = raw.tell
    # Small buffers: the lines before a cut in a truncated file still count.
    lines = stream if isinstance(stream, (type(raw), gzip.GzipFile)) else io.BufferedReader(stream, 1 << 16)
    try:
        for n, line in enumerate(lines, 1):
            if not line.strip():
                yield Record(path, f"line {n}", error="blank line")
                continue
            try:
                decoded = line.decode("utf-8")
            except UnicodeDecodeError as e:
                yield Record(path, f"line {n}", error=f"bad UTF-8 at byte {e.start} of the line")
                continue
            try:
                obj = json.loads(decoded)
            except json.JSONDecodeError as e:
                yield Record(path, f"line {n}", error=f"not JSON ({e.msg} at column {e.colno})")
                continue
            text, error = text_of(obj, field, check)
            yield Record(path, f"line {n}", text=text, error=error)
    except (OSError, EOFError) as e:  # a truncated .gz or .zst: the records before it count
        yield Record(path, "end", error=f"the file cannot be read to its end ({e})")
    finally:
        raw.close()


def column_records(path, batches, field, check, where="row"):
    n = 0
    for batch in batches:
        for value in batch.column(batch.schema.get_field_index(field)).to_pylist():
            n += 1
            text, error = text_of({field: value}, field, check)
            yield Record(path, f"{where} {n}", text=text, error=error)


def parquet_records(path, field, progress, check):
    pa = import_pyarrow(path)
    try:
        pf = pa.parquet.ParquetFile(path)
    except Exception as e:
        fail(f"{path}: not a Parquet file ({e})")
    names = pf.schema_arrow.names
    if field not in names:
        fail(f"{path}: no column '{field}' (columns: {', '.join(names)}); choose one with --text-field")
    size, groups = os.path.getsize(path), max(1, pf.num_row_groups)
    done = [0]
    progress.current = lambda: size * done[0] // groups

    def batches():
        for g in range(pf.num_row_groups):
            yield from pf.iter_batches(batch_size=1024, row_groups=[g], columns=[field])
            done[0] = g + 1
    yield from column_records(path, batches(), field, check)


def hf_arrow_files(folder, split):
    """The Arrow files of a save_to_disk folder, in the dataset's order."""
    dict_json = os.path.join(folder, "dataset_dict.json")
    if os.path.isfile(dict_json):
        with open(dict_json) as f:
            splits = json.load(f).get("splits", [])
        if split not in splits:
            fail(f"{folder}: a DatasetDict with splits {', '.join(splits)}; choose one with --hf-split "
                 f"(now '{split}')")
        folder = os.path.join(folder, split)
    with open(os.path.join(folder, "state.json")) as f:
        state = json.load(f)
    files = [os.path.join(folder, d["filename"]) for d in state.get("_data_files", [])]
    missing = [p for p in files if not os.path.isfile(p)]
    if not files or missing:
        fail(f"{folder}/state.json: lists {len(files)} data files, missing {', '.join(missing) or 'all'}")
    return files


def hf_records(folder, field, split, progress, check):
    pa = import_pyarrow(folder)
    for path in hf_arrow_files(folder, split):
        with pa.memory_map(path) as source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:  # some writers use the file (random access) format
                reader = pa.ipc.open_file(source)
                reader = (reader.get_batch(i) for i in range(reader.num_record_batches))
                names = None
            else:
                names = reader.schema.names
            if names is not None and field not in names:
                fail(f"{path}: no column '{field}' (columns: {', '.join(names)}); choose one with --text-field")
            progress.current = source.tell
            yield from column_records(path, reader, field, check)
        progress.done_files += os.path.getsize(path)
    progress.current = lambda: 0


def text_records(path, split, progress):
    """Plain text: the whole file one document, or one per line or per
    blank-line-separated paragraph."""
    with open(path, "rb") as f:
        progress.current = f.tell
        if split == "file":
            data = f.read()
            chunks = [(data, "file")]
        else:
            chunks = text_chunks(f, split)
        for chunk, where in chunks:
            try:
                text = chunk.decode("utf-8")
            except UnicodeDecodeError as e:
                yield Record(path, where, error=f"bad UTF-8 at byte {e.start} of the {where.split()[0]}")
                continue
            yield Record(path, where, text=text) if text.strip() else Record(path, where, error="empty text")


def text_chunks(f, split):
    if split == "line":
        for n, line in enumerate(f, 1):
            if line.strip():
                yield line.rstrip(b"\r\n"), f"line {n}"
        return
    para, start, n = [], 0, 0
    for n, line in enumerate(f, 1):
        if line.strip():
            start = start or n
            para.append(line)
        elif para:
            yield b"".join(para).rstrip(b"\r\n"), f"paragraph at line {start}"
            para, start = [], 0
    if para:
        yield b"".join(para).rstrip(b"\r\n"), f"paragraph at line {start}"


def records(inputs, field="text", text_split="file", hf_split="train", check=None):
    """Returns (Progress, generator of Record). check: for a field that is not
    text (conversations), value -> (document, None) or (None, reason)."""
    paths = expand(inputs)
    kinds = [(p, kind_of(p)) for p in paths]
    if check is not None:
        for p, k in kinds:
            if k == "text":
                fail(f"{p}: plain text holds no conversations (--chat reads JSON lines, Parquet or datasets folders)")
    progress = Progress(sum(disk_size(p) for p in paths))

    def gen():
        for path, kind in kinds:
            if kind == "jsonl":
                yield from jsonl_records(path, field, progress, check)
            elif kind == "parquet":
                yield from parquet_records(path, field, progress, check)
            elif kind == "hf":
                yield from hf_records(path, field, hf_split, progress, check)
                continue  # hf_records counted its own files
            else:
                yield from text_records(path, text_split, progress)
            progress.done_files += disk_size(path)
            progress.current = lambda: 0
    return progress, gen()
