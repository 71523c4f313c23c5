"""TransformersBackend: serves a Hugging Face causal LM in-process, with exact token truth.

It implements ``boltrl.gateway.backend.Backend``. Requests are rendered with the model's
chat template (see ``boltrl_trainer._chat`` for tools), tokenized once, and sampled by a
custom loop (``boltrl_trainer._sampling``) that records the exact prompt ids fed to the
model, the exact ids sampled and their logprobs. Nothing is ever re-tokenized.

Threads: one worker thread owns generation, so the asyncio loop that awaits ``generate``
stays free. Requests that arrive within ``batch_window_s`` of each other (up to
``max_batch``) start one sampling loop together; a request that arrives while a loop runs
joins it at the next step when a slot is free (continuous batching). Each reply is
returned as soon as its own row stops. A prompt is computed from the longest prefix the
backend computed before under the same weights (``_prompt_cache``: the system prompt and
tools an agent repeats, the previous turns of an episode; requests with the same prompt
share one prefill), and on a CPU a LoRA model samples through merged weights
(``_lora_merge``: the model's own tensors untouched), one matmul per adapted layer.

Token truth (what each ``Generation`` records):

- ``prompt_token_ids``: the rendered prompt tokenized once with ``add_special_tokens=False``
  (the template writes its own special tokens); they decode to the rendered prompt.
- ``response_token_ids``: every id sampled, including the EOS id when the model stopped by
  itself (the trainer needs it to learn to stop) and the ids that completed a stop string.
  ``text`` excludes the EOS and is cut before the stop string (OpenAI semantics).
- ``response_logprobs``: per sampled id, ``log_softmax(logits / T)`` over the whole
  vocabulary, i.e. the temperature-scaled distribution *before* top-p truncation (what a
  trainer recomputes from the same logits); greedy requests (``T = 0``) record the
  unscaled ``log_softmax(logits)``. Equal to a fresh unpadded forward pass within float
  noise (tested at 1e-4 on CPU float32), also for rows batched with others.
- ``template_hash``: sha256 of the chat template text; ``policy_version``: see below.

Weights: it is a ``boltrl_trainer.seams.PolicyServer``. The trainer updates
``backend.model`` in place (or swaps it) inside ``with backend.paused():`` (once asked
for, the running loop admits no new requests; the call blocks until the replies in
flight end, and no loop starts inside the block), then sets ``policy_version`` — the
sequence ``seams.weight_swap`` writes once. Every reply carries the version its whole
loop ran under.

Streaming (``generate_stream``): a request's text leaves in pieces as its row is
sampled (from the worker thread, between steps of the loop), then its ``Generation``,
identical to what ``generate`` returns; see the method for what is held back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boltrl_trainer._chat as _chat
from boltrl.errors import BackendError, BackendUnavailable, InvalidInput
from boltrl.gateway.backend import Generation, GenerationRequest
from boltrl_trainer._prompt_cache import DEFAULT_CACHE_POSITIONS, PromptCache
from boltrl_trainer.models import DEFAULT_MODEL, ensure_chat_template, is_default, load_model
from boltrl_trainer.update import load_trainable

if TYPE_CHECKING:
    import torch

    from boltrl_trainer._sampling import Row

log = logging.getLogger(__name__)

__all__ = ["TransformersBackend"]


@dataclass(eq=False)
class _Job:
    request: GenerationRequest
    future: concurrent.futures.Future[Generation]
    template_hash: str | None = None
    parse_tools: bool = False
    on_text: Callable[[str], None] | None = None
    """Streaming: called on the worker thread with each new piece of certain text."""
    sent: str = ""
    """The text handed to ``on_text`` so far."""


_STOP = object()


class TransformersBackend:
    """An in-process Hugging Face model behind the gateway (CPU or one GPU).

    Args:
        model: a model name or path (see ``boltrl_trainer.models.resolve_model``; default
            ``"smollm2"``), or a loaded ``PreTrainedModel`` (then ``tokenizer`` is required).
        tokenizer: the tokenizer, when ``model`` is an object; a tokenizer without a chat
            template gets SmolLM2's.
        device: where to load a model given by name (``"cpu"``, ``"cuda"``, …).
        dtype: dtype to load a model given by name (default float32 on CPU, bf16 on CUDA).
        max_batch: most requests sampled together.
        batch_window_s: how long the first request of a batch waits for company.
        max_tokens: reply length cap when a request sets none (and the upper bound of any).
        model_name: the name served under ``/v1/models`` (default: the model's name).
        seed: seeds the shared sampling generator (requests with their own ``seed`` use
            a private generator, so they repeat exactly when run alone).
        cache_positions: most token positions whose keys and values are kept for later
            prompts that start the same way (emptied whenever the weights may change:
            on ``paused()``); 0 turns prefix reuse off.

    Promises: ``generate`` may be awaited concurrently from any number of tasks and never
    blocks the event loop; ``generate_sync`` may be called from any thread. Both raise
    ``InvalidInput`` for a request that cannot be rendered or is too long for the context,
    ``BackendError`` when the model fails, ``BackendUnavailable`` once closed.
    """

    def __init__(
        self,
        model: Any = "smollm2",
        tokenizer: Any = None,
        *,
        device: str = "cpu",
        dtype: Any = None,
        max_batch: int = 8,
        batch_window_s: float = 0.01,
        max_tokens: int = 1024,
        model_name: str | None = None,
        seed: int | None = None,
        cache_positions: int = DEFAULT_CACHE_POSITIONS,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch: must be at least 1")
        if batch_window_s < 0:
            raise ValueError("batch_window_s: must be >= 0")
        if max_tokens < 1:
            raise ValueError("max_tokens: must be at least 1")
        if cache_positions < 0:
            raise ValueError("cache_positions: must be >= 0")
        if isinstance(model, str | os.PathLike):
            name = DEFAULT_MODEL if is_default(model) else str(model)
            loaded, loaded_tok = load_model(model, device=device, dtype=dtype)
            model, tokenizer = loaded, tokenizer or loaded_tok
        else:
            if tokenizer is None:
                raise ValueError("tokenizer: required when model is a loaded model object")
            name = str(getattr(getattr(model, "config", None), "name_or_path", "") or "model")
        ensure_chat_template(tokenizer)
        self._model = model
        self.tokenizer = tokenizer
        """The tokenizer; treat as read-only (it is used from the worker thread)."""
        self._name = model_name or name
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.max_tokens = max_tokens
        self._seed = seed
        self._version = 0
        self._lock = threading.RLock()  # held by the worker for a whole batch
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._start_lock = threading.Lock()
        self._generator: torch.Generator | None = None
        self._prompts = PromptCache(cache_positions)  # used under self._lock only
        self._stats = dict.fromkeys(
            (
                "batches",
                "requests",
                "prompt_tokens",
                "prefill_tokens",
                "cached_tokens",
                "completion_tokens",
                "steps",
                "row_steps",
            ),
            0,
        )
        self._pause_requests = 0  # threads waiting in paused(): admit no newcomers meanwhile
        self._pause_count_lock = threading.Lock()
        self._stopping = False  # the worker met the stop sentinel while admitting

    # ------------------------------------------------------------------ Backend protocol

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def policy_version(self) -> int:
        """Version of the weights now served; bumped by the trainer after each update."""
        return self._version

    async def generate(self, request: GenerationRequest) -> Generation:
        """Produce one assistant turn. Does not block the event loop; cancel-safe."""
        return await asyncio.wrap_future(self.submit(request))

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[str | Generation]:
        """``boltrl.gateway.backend.StreamingBackend``: the reply's text in pieces as the
        continuous-batching loop samples it, then the ``Generation`` ``generate`` returns.

        A piece leaves once it is certain: text that a stop string could still cut, a
        partly decoded character and trailing whitespace (which decoding may yet fold)
        wait for the next token or the end. A request whose tools the model may call
        streams its text up to a tool call; the calls follow at the end, once parsed."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[str | None] = asyncio.Queue()

        def put(item: str | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                loop.call_soon_threadsafe(events.put_nowait, item)

        future = self.submit(request, on_text=put)
        # after every piece: both come from the worker thread, in order
        future.add_done_callback(lambda _: put(None))
        while (item := await events.get()) is not None:
            yield item
        gen: Generation = await asyncio.wrap_future(future)
        yield gen

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # ------------------------------------------------------------------ sync API

    def submit(
        self, request: GenerationRequest, *, on_text: Callable[[str], None] | None = None
    ) -> concurrent.futures.Future[Generation]:
        """Queue a request; the future resolves when its reply is complete. Thread-safe.

        ``on_text``: called on the worker thread with each certain piece of the reply's
        text as it is sampled (see ``generate_stream``); it must not block or raise."""
        if self._closed:
            raise BackendUnavailable("the backend is closed")
        self._ensure_worker()
        job = _Job(request, concurrent.futures.Future(), on_text=on_text)
        self._queue.put(job)
        return job.future

    def generate_sync(self, request: GenerationRequest, timeout: float | None = None) -> Generation:
        """Blocking ``generate`` for threads without an event loop (trainers, benchmarks)."""
        return self.submit(request).result(timeout)

    def close(self) -> None:
        """Stop the worker after the running batch; queued requests fail. Idempotent."""
        with self._start_lock:
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, _Job) and job.future.set_running_or_notify_cancel():
                job.future.set_exception(BackendUnavailable("the backend was closed"))

    # ------------------------------------------------------------------ weights

    @property
    def model(self) -> Any:
        """The served model. The trainer may modify it in place inside ``paused()``."""
        return self._model

    @model.setter
    def model(self, model: Any) -> None:
        with self.paused():
            self._model = model

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold generation off: blocks until the running batch ends; no batch starts inside.

        A running loop stops taking in new requests as soon as a pause is asked for, so the
        wait is at most the longest reply in flight. Re-entrant on the same thread. Requests
        keep queueing and run when the block exits.
        """
        with self._pause_count_lock:
            self._pause_requests += 1
        try:
            self._lock.acquire()
        finally:
            with self._pause_count_lock:
                self._pause_requests -= 1
        try:
            self._prompts.clear()  # whatever happens in the block may change the weights
            yield
        finally:
            self._lock.release()

    def stats(self) -> dict[str, int]:
        """Counters since start: ``batches`` (sampling loops started), ``requests``,
        ``prompt_tokens``, ``prefill_tokens`` (prompt positions the model computed),
        ``cached_tokens`` (prompt positions taken from keys and values computed before:
        a shared prompt, the beginning of an earlier prompt or reply), ``completion_tokens``,
        ``steps`` (forward passes) and ``row_steps`` (rows carried, summed over steps:
        ``row_steps / steps`` is the mean batch occupancy)."""
        return dict(self._stats)

    def set_policy_version(self, version: int) -> None:
        """Set the served version (after an update, or when resuming). Waits for the batch."""
        with self.paused():
            self._version = int(version)

    def load_weights(self, path: Path) -> None:
        """Serve the trainable weights of a torch-backend checkpoint folder (its
        ``trainable.safetensors``); raises ``InvalidInput`` when it has none."""
        with self.paused():
            load_trainable(self._model, path)

    # ------------------------------------------------------------------ worker

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._closed:
                raise BackendUnavailable("the backend is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="boltrl-transformers-backend", daemon=True
                )
                self._thread.start()

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        """The batch that ``first`` opens: whatever waits already, then arrivals in the window."""
        jobs, stop = [first], False
        deadline = time.monotonic() + self.batch_window_s
        while len(jobs) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                try:
                    item = self._queue.get(timeout=wait)
                except queue.Empty:
                    break
            if item is _STOP:
                stop = True
                break
            jobs.append(item)
        return jobs, stop

    def _run(self) -> None:
        threads = os.environ.get("BOLTRL_GENERATION_THREADS")
        if threads:
            # torch's thread count is per calling thread (an OpenMP setting), so this sets
            # generation's alone: decoding runs many tiny matmuls, and on a loaded machine
            # every one of them waits for its slowest thread (rag_agent's 24 greedy
            # validations: 210 s at 2 threads under load ~4, 50 s at 1 under load ~1),
            # while the update's large matmuls still use every thread.
            import torch

            torch.set_num_threads(int(threads))
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            jobs, stop = self._collect(item)
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if jobs:
                try:
                    self._run_batch(jobs)
                except Exception as e:  # never let the worker die
                    log.exception("generation failed")
                    for job in jobs:
                        if not job.future.done():
                            job.future.set_exception(BackendError(f"generation failed: {e}"))
            if stop or self._stopping:
                return

    def _prepare(self, job: _Job, context: int) -> Row | None:
        """Render and tokenize one request into a Row; fail its future on bad input.

        Also notes on ``job`` the template hash and whether to parse tool calls."""
        import torch

        from boltrl_trainer._sampling import Row

        req = job.request
        try:
            text, template_hash = _chat.render(
                self.tokenizer, req.messages, req.tools, req.tool_choice
            )
            ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            room = context - len(ids)
            if room < 1:
                raise InvalidInput(
                    f"messages: the prompt is {len(ids)} tokens; the context holds {context}"
                )
            if req.max_tokens is not None and req.max_tokens < 1:
                raise InvalidInput("max_tokens: must be at least 1")
            if req.temperature is not None and req.temperature < 0:
                raise InvalidInput("temperature: must be >= 0")
            if req.top_p is not None and not 0 < req.top_p <= 1:
                raise InvalidInput("top_p: must be in (0, 1]")
        except InvalidInput as e:
            job.future.set_exception(e)
            return None
        except Exception as e:
            job.future.set_exception(InvalidInput(f"messages: cannot render the chat: {e}"))
            return None
        generator = None
        if req.seed is not None:
            generator = torch.Generator(device=self._device()).manual_seed(req.seed)
        row = Row(
            prompt_ids=ids,
            max_new_tokens=min(req.max_tokens or self.max_tokens, self.max_tokens, room),
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            stop=[s for s in req.stop if s],
            generator=generator,
        )
        job.template_hash = template_hash
        job.parse_tools = bool(req.tools) and req.tool_choice != "none"
        return row

    def _device(self) -> Any:
        return next(self._model.parameters()).device

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        gen_cfg = getattr(self._model, "generation_config", None)
        for value in (getattr(gen_cfg, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        return frozenset(ids)

    def _admit(self, free: int, context: int, owners: dict[int, _Job]) -> list[Row]:
        """Up to ``free`` waiting requests as rows, without waiting; none while a pause is
        requested or the backend is stopping (so a running loop drains and lets go)."""
        rows: list[Row] = []
        while len(rows) < free and not self._pause_requests and not self._stopping:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                self._stopping = True
                break
            if not item.future.set_running_or_notify_cancel():
                continue
            row = self._prepare(item, context)
            if row is not None:
                owners[id(row)] = item
                rows.append(row)
        self._count(rows)
        return rows

    def _count(self, rows: list[Row]) -> None:
        self._stats["requests"] += len(rows)
        self._stats["prompt_tokens"] += sum(len(r.prompt_ids) for r in rows)

    def _run_batch(self, jobs: list[_Job]) -> None:
        """Generate for ``jobs`` and for whatever arrives while they run, under the lock."""
        import torch

        from boltrl_trainer._lora_merge import merged_lora
        from boltrl_trainer._sampling import Sampler

        with self._lock:
            model, version = self._model, self._version
            context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
            owners: dict[int, _Job] = {}
            rows = []
            for job in jobs:
                row = self._prepare(job, context)
                if row is not None:
                    owners[id(row)] = job
                    rows.append(row)
            if not rows:
                return
            if self._generator is None:
                self._generator = torch.Generator(device=self._device())
                if self._seed is None:
                    self._generator.seed()
                else:
                    self._generator.manual_seed(self._seed)
            eos_ids = self._eos_ids()
            pad_id = self.tokenizer.pad_token_id
            if pad_id is None:
                pad_id = min(eos_ids) if eos_ids else 0
            self._stats["batches"] += 1
            self._count(rows)

            def finish(row: Row) -> None:
                self._stats["completion_tokens"] += len(row.ids)
                job = owners.pop(id(row))
                job.future.set_result(self._reply(job, row, version, eos_ids))

            def token(row: Row) -> None:
                job = owners[id(row)]
                if job.on_text is not None:
                    self._stream_text(job, row)

            sampler = Sampler(
                model,
                pad_id=pad_id,
                eos_ids=eos_ids,
                decode=self._decode,
                on_finish=finish,
                generator=self._generator,
                stats=self._stats,
                on_token=token,
                prompt_cache=self._prompts,
            )
            was_training = model.training
            model.eval()
            try:
                # CPU only: there the adapters' extra ops cost more than a copy of the
                # adapted weights; an accelerator's memory is the scarcer resource
                cpu = self._device().type == "cpu"
                with merged_lora(model) if cpu else contextlib.nullcontext():
                    sampler.run(
                        rows, lambda free: self._admit(free, context, owners), self.max_batch
                    )
            except Exception as e:
                log.exception("generation failed")
                for job in owners.values():
                    if not job.future.done():
                        job.future.set_exception(BackendError(f"generation failed: {e}"))
            finally:
                model.train(was_training)

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _stream_text(self, job: _Job, row: Row) -> None:
        """Hand ``job.on_text`` the text of a running row that is now certain: what no
        stop string can still cut, with no partial character or trailing whitespace;
        with tools, only the text before a tool call (what ``_chat.parse_tool_calls``
        keeps as content). A reply with tools that opens with whitespace is not streamed:
        its content keeps that whitespace or not depending on whether a call follows."""
        assert job.on_text is not None
        text = self._decode(row.ids)  # the row goes on, so no EOS among its ids
        hold = max((len(s) - 1 for s in row.stop), default=0)
        if job.parse_tools:
            if text[:1].isspace():
                return
            marker = text.find(_chat.TOOL_CALL_OPEN)
            if marker < 0:  # the text's end may be where a call opens
                hold = max(hold, len(_chat.TOOL_CALL_OPEN) - 1)
            else:
                text = text[:marker]
        end = len(text) - hold
        certain = text[: max(end, 0)].rstrip("\ufffd").rstrip()
        if len(certain) > len(job.sent) and certain.startswith(job.sent):
            piece, job.sent = certain[len(job.sent) :], certain
            try:
                job.on_text(piece)
            except Exception:  # a listener's failure must not end the batch
                log.exception("token streaming: the listener failed")
                job.on_text = None

    def _reply(self, job: _Job, row: Row, version: int, eos_ids: frozenset[int]) -> Generation:
        ids = row.ids[:-1] if row.ids and row.ids[-1] in eos_ids else row.ids
        text = self._decode(ids)
        if row.text_end is not None:
            text = text[: row.text_end]
        content: str | None = text
        tool_calls: list[dict[str, Any]] = []
        finish = row.finish_reason or "length"
        if job.parse_tools:
            content, tool_calls = _chat.parse_tool_calls(text)
            if tool_calls and finish == "stop":
                finish = "tool_calls"
        return Generation(
            text=content,
            tool_calls=tool_calls,
            finish_reason=finish,
            prompt_token_ids=list(row.prompt_ids),
            response_token_ids=list(row.ids),
            response_logprobs=list(row.logprobs),
            policy_version=version,
            template_hash=job.template_hash,
            model=self._name,
            usage={
                "prompt_tokens": len(row.prompt_ids),
                "completion_tokens": len(row.ids),
                "total_tokens": len(row.prompt_ids) + len(row.ids),
            },
        )
