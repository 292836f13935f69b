"""``eagle3 train regenerate``: training data whose assistant turns are the target's own responses.

The draft learns to predict the target's next tokens, so EAGLE-3 trains it on text the target
itself wrote: responses written by another model (or by people) teach it a distribution it
never meets at inference. Every record of the input JSONL with "messages" has each assistant
message rewritten: the conversation before it (earlier assistant turns already rewritten) is
rendered with the target's chat template and a generation prompt, the target generates until
EOS or ``max_new_tokens``, and the decoded text (special tokens skipped, whitespace stripped)
replaces the content. Records without "messages" ("text", "input_ids") pass through unchanged,
so a mixed file stays one file. Every output line keeps the record's other keys and gains a
"regenerated" block: where it came from (index over the input, file, line, a digest of the
input line), the settings that decide its text, and the turns and tokens generated.

Batching: ``batch_size`` conversations are in flight at once; each step generates the next
assistant turn of every conversation in flight as one left-padded batch (Hugging Face's
generate, or ``SpeculativeGenerator`` with a draft), and a finished conversation makes room
for the next.

Resume: a finished conversation is appended and flushed at once, in input order, so an
interrupted run leaves a valid prefix that already trains. Rerunning the same command checks
the lines already written against the input and the settings (other input or other settings
are an error, never appended to) and continues after them.

Data parallel under torchrun: rank r of W takes conversations r, r + W, ... and appends them
to its own part file next to ``out`` (``<out>.part-<r>``); rank 0 then waits until the parts
hold every conversation and merges them in input order into ``out`` (through a temporary file
and a rename, so ``out`` is always its old prefix or the complete result). A rerun at any world
size continues from ``out`` and the parts. After one barrier at the start, the ranks meet
through the files, not through collectives: their shares end at different times, and a
collective waiting for the slowest rank would run into the process group's timeout.
"""

from __future__ import annotations

import copy
import glob
import hashlib
import json
import logging
import os
import re
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import validation
from ..api.config import SamplingConfig
from ..api.generator import SpeculativeGenerator
from ..api.settings import MAX_SEED
from ..bench.baseline import hf_generate
from ..distributed import tp
from ..dtypes import DTYPES, check_dtype_name
from ..errors import BadInputError, BadInputTypeError
from ..preflight.loading import check_device, default_device, load_target, load_tokenizer
from .data import jsonl_records

logger = logging.getLogger(__name__)

PROVENANCE_KEY = "regenerated"
# What the provenance block records of the settings; a resumed run must match them.
SETTING_KEYS = ("target", "dtype", "max_new_tokens", "temperature", "top_p", "top_k", "seed")
POLL_S = 2.0  # rank 0's pause between looks at the other ranks' part files
_START_OVER = "write to another out file, or delete this one and its .part-* files to start over"


@dataclass
class RegenerateConfig:
    """Everything ``eagle3 train regenerate`` takes; lengths in tokens."""

    target: str
    data: List[str]                            # JSONL files, read in order
    out: str                                   # a .jsonl file (the trainer reads JSONL only from *.jsonl)
    draft: Optional[str] = None                # speculative generation: the same text, sooner
    max_new_tokens: int = 1024                 # per assistant turn
    batch_size: int = 8                        # conversations in flight per process
    temperature: float = 0.0                   # 0: greedy
    top_p: float = 1.0                         # sampling only; 1 = off
    top_k: int = 0                             # sampling only; 0 = off
    seed: int = 0                              # sampling only
    dtype: str = "float32"                     # the target's weights
    device: Optional[str] = None               # default: this process's CUDA device if there is one, else CPU
    progress: bool = True

    def validate(self) -> None:
        """Raises TypeError / ValueError (FileNotFoundError for a missing file) naming the first
        bad field; 0, "" and [] are errors, never "the default" (None is)."""
        validation.existing_dir("target", self.target)
        if isinstance(self.data, (str, os.PathLike)) or not isinstance(self.data, (list, tuple)) or not self.data:
            raise BadInputTypeError(f"data must be a non-empty list of JSONL file paths, got {self.data!r}")
        for i, item in enumerate(self.data):
            path = validation.existing_file(f"data[{i}]", item)
            if not path.endswith(".jsonl"):
                raise BadInputError(f"data[{i}] must be a .jsonl file of records with \"messages\", got {path}")
        out = validation.path("out", self.out)
        if not out.endswith(".jsonl"):
            raise BadInputError(f"out must name a .jsonl file (the trainer reads JSONL only from *.jsonl files), "
                                f"got {out}")
        if os.path.isdir(out):
            raise BadInputError(f"out: {out} is a directory, expected a file to write")
        for i, item in enumerate(self.data):
            if os.path.exists(out) and os.path.samefile(out, item):
                raise BadInputError(f"out must not be one of the data files, got data[{i}] ({item}) again")
        if self.draft is not None:
            validation.existing_dir("draft", self.draft)
        validation.integer("max_new_tokens", self.max_new_tokens, 1)
        validation.integer("batch_size", self.batch_size, 1)
        SamplingConfig(self.temperature, self.top_p, self.top_k)
        validation.integer("seed", self.seed, 0, MAX_SEED)
        check_dtype_name("dtype", self.dtype)
        if self.device is not None:
            check_device(self.device)
        validation.boolean("progress", self.progress)

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    def settings(self) -> Dict[str, Any]:
        """The settings that decide the text, as each output line records them (the draft is
        not one: it changes the speed, never the text)."""
        recorded: Dict[str, Any] = {"target": os.path.basename(os.path.normpath(self.target)), "dtype": self.dtype,
                                    "max_new_tokens": self.max_new_tokens, "temperature": float(self.temperature)}
        if self.sampling:
            recorded.update(top_p=float(self.top_p), top_k=self.top_k, seed=self.seed)
        return recorded


# --- the input ----------------------------------------------------------------------------------

@dataclass
class Source:
    """One input record: its place (index over all files, file and line) and content."""

    index: int
    path: str
    line: int
    digest: str             # of the line's text: another input at the same place is told apart
    record: Dict[str, Any]
    turns: List[int]        # positions of its assistant messages; [] passes the record through

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _assistant_turns(record: Dict[str, Any], where: str) -> List[int]:
    if "messages" not in record:
        if isinstance(record.get("text"), str) or "input_ids" in record:
            return []  # passed through: the trainer reads it as it is
        raise BadInputError(f"{where}: expected a \"messages\" list (or a \"text\" string or an \"input_ids\" list, "
                            "which pass through unchanged)")
    messages = record["messages"]
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise BadInputError(f"{where}: \"messages\" must be a non-empty list of {{\"role\": str, \"content\": str}} "
                            "objects")
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise BadInputError(f"{where}: the conversation has no assistant message to regenerate; end it with "
                            "{\"role\": \"assistant\", \"content\": \"\"} to have the target answer it")
    return turns


def read_sources(paths: List[str]) -> List[Source]:
    """Every non-blank line of every file, in order; a line that is no JSON object, or a
    conversation the trainer could not read, is an error naming file:line."""
    sources: List[Source] = []
    for i, path in enumerate(paths):
        content = validation.read_text_file(f"data[{i}]", path)
        for n, line, record in jsonl_records(path, content):
            where = f"{path}:{n}"
            digest = hashlib.sha256(line.strip().encode("utf-8")).hexdigest()[:16]
            sources.append(Source(len(sources), path, n, digest, record, _assistant_turns(record, where)))
    return sources


# --- what earlier runs wrote -------------------------------------------------------------------

def part_path(out: str, rank: int) -> str:
    return f"{out}.part-{rank}"


def _part_paths(out: str) -> List[str]:
    pattern = re.compile(re.escape(os.path.basename(out)) + r"\.part-\d+$")
    return sorted(p for p in glob.glob(glob.escape(out) + ".part-*") if pattern.match(os.path.basename(p)))


def _dump(record: Dict[str, Any]) -> str:
    """One JSONL line, UTF-8 as is, but with the characters str.splitlines() breaks at escaped,
    so that every JSONL reader sees one record per line."""
    text = json.dumps(record, ensure_ascii=False)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085") + "\n"


class LineReader:
    """The complete lines of a file that may still grow (a line counts once its newline is
    written), each call reading on from where the last one stopped."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0   # just after the last complete line read
        self.count = 0    # complete lines read

    def read(self) -> List[Tuple[int, int, str]]:
        """The new complete lines as (start, end, text) with byte offsets; [] for a file that
        is gone (a part merged away by rank 0)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        lines, pos = [], 0
        while (newline := data.find(b"\n", pos)) >= 0:
            lines.append((self.offset + pos, self.offset + newline + 1,
                          data[pos:newline].decode("utf-8", errors="replace")))
            pos = newline + 1
        self.offset += pos
        self.count += len(lines)
        return lines


def origin_of(source: Source) -> Tuple[str, int, str]:
    """How an output line names its record: file name, line number, digest of the line."""
    return os.path.basename(source.path), source.line, source.digest


def _check_written(text: str, where: str, sources: List[Source], settings: Dict[str, Any]) -> Dict[str, Any]:
    """The provenance block of a line an earlier run wrote, once it is known to come from this
    input with these settings."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        record = None
    block = record.get(PROVENANCE_KEY) if isinstance(record, dict) else None
    if not isinstance(block, dict) or isinstance(block.get("index"), bool) or not isinstance(block.get("index"), int):
        raise BadInputError(f"{where}: not a line written by eagle3 train regenerate (no \"{PROVENANCE_KEY}\" block); "
                            f"{_START_OVER}")
    index = block["index"]
    if not 0 <= index < len(sources):
        raise BadInputError(f"{where}: written for record {index}, but this input has {len(sources)} records; "
                            f"{_START_OVER}")
    source = sources[index]
    origin = (block.get("file"), block.get("line"), block.get("input_sha256"))
    if origin != origin_of(source):
        other = "other content at the same place" if origin[:2] == origin_of(source)[:2] else "another record"
        raise BadInputError(f"{where}: written from {origin[0]}:{origin[1]}, but record {index} of this input is "
                            f"{source.where} ({other}); the file was written for other input; {_START_OVER}")
    differ = [f"{k} {block.get(k)!r} (now {settings.get(k)!r})" for k in SETTING_KEYS
              if block.get(k) != settings.get(k)]
    if differ:
        raise BadInputError(f"{where}: written with other settings: {', '.join(differ)}; rerun with those, or "
                            f"{_START_OVER}")
    return block


@dataclass
class Written:
    """What is on disk: ``out``'s lines (records 0 .. prefix - 1, in order) and every part
    file's, by record index."""

    prefix: int = 0
    prefix_end: int = 0                      # byte offset just after out's last complete line
    where: Dict[int, Tuple[str, int, int]] = field(default_factory=dict)   # index -> (file, start, end)
    readers: Dict[str, LineReader] = field(default_factory=dict)           # one per part file
    new: Dict[str, int] = field(default_factory=lambda: {"records": 0, "turns": 0, "tokens": 0})

    def add(self, path: str, start: int, end: int, block: Dict[str, Any], counted: bool) -> None:
        if block["index"] in self.where:
            return  # (a part merged into out, then left behind by an interrupted clean-up)
        self.where[block["index"]] = (path, start, end)
        if counted:  # written by this run
            self.new["records"] += 1
            self.new["turns"] += int(block.get("turns", 0))
            self.new["tokens"] += int(block.get("new_tokens", 0))

    def read_parts(self, out: str, sources: List[Source], settings: Dict[str, Any], counted: bool) -> None:
        """Reads on in every part file, new ones included."""
        for path in _part_paths(out):
            reader = self.readers.setdefault(path, LineReader(path))
            before = reader.count
            for n, (start, end, text) in enumerate(reader.read(), before + 1):
                block = _check_written(text, f"{path}:{n}", sources, settings)
                self.add(path, start, end, block, counted)


def scan_written(out: str, sources: List[Source], settings: Dict[str, Any]) -> Written:
    """``out``'s valid prefix and the parts' lines, each checked against the input and the
    settings; an incomplete last line (a write cut short) is left out."""
    written = Written()
    if os.path.exists(out):
        reader = LineReader(out)
        for n, (start, end, text) in enumerate(reader.read(), 1):
            block = _check_written(text, f"{out}:{n}", sources, settings)
            if block["index"] != n - 1:
                raise BadInputError(f"{out}:{n}: holds record {block['index']} where record {n - 1} belongs, so it is "
                                    f"no prefix of this input's output; {_START_OVER}")
            written.add(out, start, end, block, counted=False)
        written.prefix, written.prefix_end = reader.count, reader.offset
    written.read_parts(out, sources, settings, counted=False)
    return written


# --- generation --------------------------------------------------------------------------------

class Conversation:
    """A record on its way through: its messages, with the assistant turns answered so far."""

    def __init__(self, source: Source):
        self.source = source
        self.record = copy.deepcopy(source.record)
        self.turn = 0          # assistant turns answered
        self.new_tokens = 0

    @property
    def finished(self) -> bool:
        return self.turn == len(self.source.turns)

    def prompt(self) -> List[Dict[str, str]]:
        """The conversation before the next assistant message."""
        return self.record["messages"][: self.source.turns[self.turn]]

    def answer(self, text: str, new_tokens: int) -> None:
        self.record["messages"][self.source.turns[self.turn]]["content"] = text
        self.turn += 1
        self.new_tokens += new_tokens

    def line(self, settings: Dict[str, Any]) -> str:
        file, line, digest = origin_of(self.source)
        self.record[PROVENANCE_KEY] = {"index": self.source.index, "file": file, "line": line,
                                       "input_sha256": digest, **settings, "turns": self.turn,
                                       "new_tokens": self.new_tokens}
        return _dump(self.record)


Respond = Callable[[List[List[int]], int], List[List[int]]]


def _eos_ids(target, tokenizer) -> List[int]:
    """The target's stop tokens: its generation config's EOS ids, then the tokenizer's."""
    ids: List[int] = []
    for value in (getattr(getattr(target, "generation_config", None), "eos_token_id", None),
                  getattr(tokenizer, "eos_token_id", None)):
        for t in ([value] if isinstance(value, int) else list(value or [])):
            if t not in ids:
                ids.append(int(t))
    return ids


def make_responder(config: RegenerateConfig, target, tokenizer, device: torch.device) -> Respond:
    """A function from token-id prompts and a seed to the target's new tokens per prompt (its
    stop token included): Hugging Face's generate, or speculative decoding with the draft."""
    options: Dict[str, Any] = dict(do_sample=False)
    if config.sampling:
        options = dict(do_sample=True, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
    options["eos_token_id"] = _eos_ids(target, tokenizer) or None
    if config.draft is None:
        def respond(prompts: List[List[int]], seed: int) -> List[List[int]]:
            return hf_generate(target, tokenizer, prompts, config.max_new_tokens,
                               seed=seed if config.sampling else None, **options)[0]
        return respond

    # check_ranks off: under torchrun the ranks are data parallel, each on other prompts.
    generator = SpeculativeGenerator.from_pretrained(target, config.draft, tokenizer=tokenizer, device=device,
                                                     check_ranks=False)

    def respond_speculatively(prompts: List[List[int]], seed: int) -> List[List[int]]:
        # A seed on every call, greedy too: without one the generator would agree on one across
        # tensor-parallel ranks, a collective these independent ranks must not enter.
        out = generator.generate(prompts, max_new_tokens=config.max_new_tokens, return_dict_in_generate=True,
                                 seed=seed, **options)
        return out.new_tokens
    return respond_speculatively


def _call_seed(seed: int, rows: List[Tuple[int, int]]) -> int:
    """A sampling seed per generate call, from the run's seed and the (record, turn) of each row,
    so that the same command samples the same text again."""
    digest = hashlib.sha256(f"{seed}:{rows}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # < 2**63, what torch.Generator takes


class Regenerator:
    """Rewrites this rank's share of the records through ``respond`` and appends them to ``sink``."""

    def __init__(self, config: RegenerateConfig, tokenizer, respond: Respond, context: Optional[int]):
        self.config = config
        self.tokenizer = tokenizer
        self.respond = respond
        self.context = context  # the target's max_position_embeddings
        self.settings = config.settings()
        self.stats = {"records": 0, "turns": 0, "tokens": 0}

    def render(self, conversation: Conversation) -> List[int]:
        """Token ids of the conversation before the next assistant message, with the generation prompt."""
        where, k = conversation.source.where, conversation.source.turns[conversation.turn]
        try:
            ids = self.tokenizer.apply_chat_template(conversation.prompt(), add_generation_prompt=True,
                                                     tokenize=True)
        except Exception as e:  # noqa: BLE001  (a template raises what its author chose)
            raise BadInputError(f"{where}: the chat template cannot render the conversation before message {k + 1}: "
                                f"{type(e).__name__}: {e}") from None
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        ids = [int(t) for t in ids]
        if not ids:
            raise BadInputError(f"{where}: message {k + 1} (assistant) has nothing before it to answer")
        if self.context is not None and len(ids) + self.config.max_new_tokens > self.context:
            raise BadInputError(f"{where}: the conversation before message {k + 1} is {len(ids)} tokens; with "
                                f"max_new_tokens={self.config.max_new_tokens} that passes the target's context "
                                f"({self.context} positions); lower --max-new-tokens or shorten the conversation")
        return ids

    def step(self, in_flight: List[Conversation]) -> None:
        """The next assistant turn of every conversation in flight, as one batch."""
        prompts = [self.render(c) for c in in_flight]
        seed = _call_seed(self.config.seed, [(c.source.index, c.turn) for c in in_flight])
        for conversation, tokens in zip(in_flight, self.respond(prompts, seed)):
            text = self.tokenizer.decode(tokens, skip_special_tokens=True).strip()
            conversation.answer(text, len(tokens))
            self.stats["turns"] += 1
            self.stats["tokens"] += len(tokens)

    def run(self, share: List[Source], sink, bar) -> None:
        """Keeps ``batch_size`` conversations in flight; writes finished ones in input order."""
        waiting = deque(share)
        in_flight: List[Conversation] = []
        finished: Dict[int, Conversation] = {}   # share position -> a conversation not yet written
        position = {s.index: p for p, s in enumerate(share)}
        next_out = 0
        while waiting or in_flight or finished:
            while waiting and len(in_flight) < self.config.batch_size:
                conversation = Conversation(waiting.popleft())
                if conversation.finished:  # passed through
                    finished[position[conversation.source.index]] = conversation
                else:
                    in_flight.append(conversation)
            if in_flight:
                self.step(in_flight)
                for c in in_flight:
                    if c.finished:
                        finished[position[c.source.index]] = c
                in_flight = [c for c in in_flight if not c.finished]
            while next_out in finished:
                sink.write(finished.pop(next_out).line(self.settings))
                sink.flush()  # a conversation is on disk once finished (an interrupt keeps it)
                next_out += 1
                self.stats["records"] += 1
                bar.update(1)
            bar.set_postfix(tokens=self.stats["tokens"])


# --- the run -----------------------------------------------------------------------------------

def _device(config: RegenerateConfig) -> torch.device:
    return torch.device(config.device) if config.device is not None else default_device()


def _append_to(path: str, valid_end: int):
    """``path`` opened for appending after its first ``valid_end`` bytes (an incomplete last
    line, a write cut short, is dropped)."""
    if os.path.exists(path) and os.path.getsize(path) > valid_end:
        os.truncate(path, valid_end)
    return open(path, "a", encoding="utf-8")


def _merge(out: str, written: Written, total: int) -> None:
    """``out`` from its prefix and the parts, in input order (through a temporary file and a
    rename); the parts are removed after."""
    temporary = out + ".tmp"
    handles: Dict[str, Any] = {}
    try:
        with open(temporary, "wb") as merged:
            for index in range(total):
                path, start, end = written.where[index]
                if path not in handles:
                    handles[path] = open(path, "rb")
                f = handles[path]
                f.seek(start)
                merged.write(f.read(end - start))
            merged.flush()
            os.fsync(merged.fileno())
    finally:
        for f in handles.values():
            f.close()
    os.replace(temporary, out)
    for path in _part_paths(out):
        os.remove(path)


def _wait_for_parts(out: str, written: Written, sources: List[Source], settings: Dict[str, Any]) -> None:
    """Rank 0: reads the parts until they hold every record. A rank that fails makes torchrun
    stop every rank, this one included, so the wait ends either way."""
    told = False
    while True:
        written.read_parts(out, sources, settings, counted=True)
        missing = len(sources) - len(written.where)
        if not missing:
            return
        if not told:
            logger.info("waiting for %d conversations from the other ranks", missing)
            told = True
        time.sleep(POLL_S)


def regenerate(config: RegenerateConfig) -> Dict[str, Any]:
    """Writes ``config.out``: ``config.data`` with every assistant turn the target's own
    response (see the module docstring). Returns counts: ``conversations`` (records in the
    input), ``resumed_from`` (records already written when this run started), ``regenerated``
    (records written by this run), ``turns_regenerated``, ``tokens_generated``, ``seconds``
    (wall clock after loading the models), ``tokens_per_s`` and ``world_size``. Under torchrun
    rank 0 reports the whole run and returns once ``out`` is complete; another rank reports its
    share and returns when the share is written."""
    from tqdm.auto import tqdm

    config.validate()
    out, rank, world = os.fspath(config.out), tp.rank(), tp.world_size()
    sources = read_sources([os.fspath(p) for p in config.data])
    tokenizer = load_tokenizer(config.target)
    if any(s.turns for s in sources) and getattr(tokenizer, "chat_template", None) is None:
        raise BadInputError(f"target {config.target}: its tokenizer has no chat template, which conversations "
                            "(\"messages\") need to be rendered")
    settings = config.settings()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    written = scan_written(out, sources, settings)
    if tp.is_distributed():
        # Every rank has read what is on disk before any rank writes or merges.
        import torch.distributed as dist
        dist.barrier()
    resumed_from = len(written.where)
    direct = world == 1 and not written.readers  # one process, no parts: appended to out itself
    share = [s for s in sources if s.index % world == rank and s.index not in written.where]
    if resumed_from:
        logger.info("resuming: %d of %d conversations are already written", resumed_from, len(sources))

    regenerator: Optional[Regenerator] = None
    started = time.perf_counter()
    if share:
        dtype = DTYPES[config.dtype]
        device = _device(config)
        target = load_target(config.target, dtype, shard=False).to(device).eval()  # data parallel: whole copies
        context = getattr(target.config, "max_position_embeddings", None)
        regenerator = Regenerator(config, tokenizer, make_responder(config, target, tokenizer, device),
                                  context if isinstance(context, int) else None)
        dest = out if direct else part_path(out, rank)
        reader = written.readers.get(dest)
        valid_end = written.prefix_end if direct else (reader.offset if reader is not None else 0)
        started = time.perf_counter()
        bar = tqdm(total=len(share), desc="eagle3 train regenerate", unit="conv", file=sys.stderr,
                   disable=not config.progress or rank != 0, dynamic_ncols=True)
        try:
            with _append_to(dest, valid_end) as sink:
                regenerator.run(share, sink, bar)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"{regenerator.stats['records']} more conversations are in {dest}; rerun the "
                                    "same command to continue") from None
        finally:
            bar.close()
    counts = regenerator.stats if regenerator is not None else {"records": 0, "turns": 0, "tokens": 0}
    if rank == 0 and not direct:
        _wait_for_parts(out, written, sources, settings)
        if written.prefix < len(sources):
            _merge(out, written, len(sources))
        else:  # out was complete: parts an interrupted clean-up left behind
            for path in _part_paths(out):
                os.remove(path)
        counts = written.new
    elif direct and not share:
        logger.info("%s already holds all %d conversations", out, len(sources))
    seconds = time.perf_counter() - started
    return {"out": out, "conversations": len(sources), "resumed_from": resumed_from,
            "regenerated": counts["records"], "turns_regenerated": counts["turns"],
            "tokens_generated": counts["tokens"], "seconds": seconds,
            "tokens_per_s": counts["tokens"] / seconds if seconds > 0 and counts["tokens"] else 0.0,
            "world_size": world}
