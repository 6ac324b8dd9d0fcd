"""`HarnessPauseConnector`: the vLLM side of per-pause KV control (see the package docstring).

The scheduler side keeps the book (`book.py`) on vLLM's block pool: a pin is one extra
reference on a finished call's full cached blocks, which keeps them out of the LRU at no cost
while idle (the engine takes no steps), and the resumed call hits them through the ordinary
prefix cache. An offload orders the worker to copy the pinned blocks to host tensors and frees
the device blocks without their cache entries; the session's next call is told those tokens
are external, gets new blocks, and the worker copies the host blocks into them before the
step's forward (a synchronous load). Everything the worker does is ordered through the
connector metadata, since the scheduler and the worker may be separate processes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from .book import (
    DEFAULT_HOST_CAP_BYTES,
    DEFAULT_TTL_S,
    KEY,
    RELEASE_ORDERS,
    Book,
    Limits,
    call_params,
)

# Under vLLM's logger, whose handlers and level the server configures (a name outside it is
# silent).
logger = init_logger("vllm." + __name__)


@dataclass
class HarnessPauseMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's orders for the worker (book.Orders, as plain lists)."""

    saves: list[tuple[int, list[int]]] = field(default_factory=list)
    loads: list[tuple[int, int, list[int]]] = field(default_factory=list)
    discards: list[int] = field(default_factory=list)


@dataclass
class HarnessPauseWorkerMetadata(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """What a worker did in a step: each save's bytes, ms and error, and the host bytes held."""

    saved: dict[int, dict[str, Any]] = field(default_factory=dict)
    host_bytes: int = 0
    loaded_bytes: int = 0  # loaded back from host copies in the step
    loaded_ms: float = 0.0

    def aggregate(self, other: Any) -> HarnessPauseWorkerMetadata:
        """Several workers (tensor parallel): bytes add up, the slowest copy counts."""
        if not isinstance(other, HarnessPauseWorkerMetadata):
            return self
        saved = dict(self.saved)
        for copy_id, theirs in other.saved.items():
            mine = saved.get(copy_id)
            saved[copy_id] = theirs if mine is None else {
                "bytes": mine["bytes"] + theirs["bytes"], "ms": max(mine["ms"], theirs["ms"]),
                "error": mine.get("error") or theirs.get("error")}
        return HarnessPauseWorkerMetadata(saved, self.host_bytes + other.host_bytes,
                                          self.loaded_bytes + other.loaded_bytes,
                                          max(self.loaded_ms, other.loaded_ms))


class _VllmPool:
    """book.PoolOps on vLLM's BlockPool."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def touch(self, blocks: Sequence[Any]) -> None:
        self.pool.touch(blocks)

    def free(self, blocks: Sequence[Any]) -> None:
        # Reversed, as the scheduler frees a request's blocks: the tail is evicted first.
        self.pool.free_blocks(list(reversed(blocks)))

    def free_count(self) -> int:
        return int(self.pool.get_num_free_blocks())

    def evictable_hits(self, block_hashes: Sequence[Any], n: int) -> int:
        """Of a call's first `n` prefix hits, those no one holds: taking them out of the free
        queue costs the allocation as much as a new block."""
        out = 0
        for block_hash in block_hashes[:n]:
            found = self.pool.get_cached_block(block_hash, [0])
            if found and found[0].ref_cnt == 0:
                out += 1
        return out

    def discard(self, blocks: Sequence[Any]) -> None:
        # A block another request or pin also holds keeps its cache entry: only what this
        # connector alone holds is forgotten.
        only_ours = {b.block_id for b in blocks if b.ref_cnt == 1}
        if only_ours:
            self.pool.evict_blocks(only_ours)
        self.pool.free_blocks(list(reversed(blocks)))


class HarnessPauseConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """Pins, host copies and their restore, driven by `kv_transfer_params` (see the package
    docstring for the protocol)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._block_size = int(vllm_config.cache_config.block_size)
        self._limits = Limits(
            block_size=self._block_size, bytes_per_block=_bytes_per_block(kv_cache_config),
            host_cap_bytes=int(extra.get("host_cap_bytes", DEFAULT_HOST_CAP_BYTES)),
            default_ttl_s=float(extra.get("default_ttl_s", DEFAULT_TTL_S)),
            release_order=str(extra.get("pin_release", RELEASE_ORDERS[0])))
        # A prefill is scheduled in chunks of at most this many tokens: what one admission
        # allocates at most.
        self._chunk_blocks = -(-int(vllm_config.scheduler_config.max_num_batched_tokens)
                               // self._block_size) + 1
        self._book: Book | None = None  # scheduler side, once the block pool is bound
        self._answers: dict[str, dict[str, Any]] = {}  # control request id -> its answer
        self._restored: dict[str, int] = {}  # request id -> tokens loaded from host
        # worker side
        self._layers: dict[str, torch.Tensor] = {}
        self._host: dict[int, dict[str, torch.Tensor]] = {}
        self._saved: dict[int, dict[str, Any]] = {}
        self._host_changed = False
        self._load_errors: set[int] = set()
        self._loaded = [0, 0.0]  # bytes and ms loaded back since the last report
        if role == KVConnectorRole.SCHEDULER:
            logger.info("%s: %s", type(self).__name__, self._limits)

    @property
    def requires_kv_delivery(self) -> bool:
        # A dropped copy is a cache miss, never lost work: no delivery to guarantee.
        return False

    # ---- scheduler side -----------------------------------------------------------------
    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self._book = Book(self._limits, _VllmPool(gpu_block_pool), time.monotonic)

    def _the_book(self) -> Book:
        if self._book is None:
            raise RuntimeError("the block pool was never bound to the connector")
        return self._book

    def on_new_request(self, request: Any) -> None:
        params = call_params(request.kv_transfer_params)
        if params is not None and "op" in params:
            arrived = getattr(request, "arrival_time", None)
            delay = max(time.time() - arrived, 0.0) if isinstance(arrived, float) else None
            self._answers[request.request_id] = self._the_book().control(params, delay)

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        params = call_params(request.kv_transfer_params)
        session = params.get("session") if params is not None else None
        book = self._the_book()
        if book.pins:  # the valve: room for this call, pins released in the declared order
            self._make_room(request, num_computed_tokens,
                            session if isinstance(session, str) else None)
        if not isinstance(session, str) or "op" in (params or {}):
            return 0, False
        n = book.restorable(request.request_id, session, request.prompt_token_ids or [],
                            request.cache_salt, num_computed_tokens)
        return n, False

    def _make_room(self, request: Any, computed: int, session: str | None) -> None:
        """Release pins until the pool can allocate what admitting `request` takes: the blocks
        of its tokens past the `computed` prefix hits (one prefill chunk at most) and the hits
        no one holds. A running call that cannot grow is preempted by vLLM and comes back here
        to be admitted again, so the valve makes room for growth too."""
        bs = self._block_size
        book = self._the_book()
        pool = book.pool
        assert isinstance(pool, _VllmPool)
        new = min(-(-(int(request.num_tokens) - computed) // bs), self._chunk_blocks)
        hits = pool.evictable_hits(getattr(request, "block_hashes", []), computed // bs)
        released = book.make_room(new + hits, exclude=session)
        if released:
            logger.info("%s: released %d pin(s) (%s) to admit %s", type(self).__name__,
                        released, book.limits.release_order, request.request_id)

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        book = self._the_book()
        before = book.restored_tokens
        params = call_params(request.kv_transfer_params)
        session = params.get("session") if params is not None else None
        if isinstance(session, str) and params is not None and "op" not in params:
            book.started(request.request_id, session)
        arrived = getattr(request, "arrival_time", None)
        book.allocated(request.request_id, blocks.get_block_ids()[0], num_external_tokens,
                       max(time.time() - arrived, 0.0) if isinstance(arrived, float) else None)
        if book.restored_tokens > before:
            self._restored[request.request_id] = book.restored_tokens - before

    def build_connector_meta(self, scheduler_output: Any) -> HarnessPauseMetadata:
        book = self._the_book()
        orders = book.take_orders()
        return HarnessPauseMetadata(orders.saves, orders.loads, orders.discards)

    def update_connector_output(self, connector_output: Any) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, HarnessPauseWorkerMetadata):
            self._the_book().worker_report(meta.saved, meta.host_bytes, meta.loaded_bytes,
                                           meta.loaded_ms)

    def request_finished(self, request: Any,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        book = self._the_book()
        book.forget_request(request.request_id)
        restored = self._restored.pop(request.request_id, 0)
        answer = self._answers.pop(request.request_id, None)
        if answer is not None:
            return False, {KEY: book.answer(answer)}
        params = call_params(request.kv_transfer_params)
        session = params.get("session") if params is not None else None
        if params is None or not isinstance(session, str) or not session:
            return False, None
        blocks = self._full_blocks(request, block_ids)
        held = book.finished(session, params.get("hold") is True, blocks,
                             list(request.all_token_ids), request.cache_salt)
        return False, {KEY: {"session": session, "held_tokens": held,
                             "restored_tokens": restored}}

    def _full_blocks(self, request: Any, block_ids: list[int]) -> list[Any]:
        """The request's full blocks in the prefix cache, in order: what a later call can
        hit (a partly filled last block never matches)."""
        pool = self._the_book().pool
        assert isinstance(pool, _VllmPool)
        out = []
        for block_id in block_ids[:request.num_computed_tokens // self._block_size]:
            block = pool.pool.blocks[block_id]
            if block.block_hash is None or block.is_null:
                break
            out.append(block)
        return out

    # ---- worker side --------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._layers = dict(kv_caches)
        shapes = {name: tuple(t.shape) for name, t in list(self._layers.items())[:1]}
        logger.info("%s: %d KV layers, block-major (first: %s)", type(self).__name__,
                    len(self._layers), shapes)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, HarnessPauseMetadata):
            return
        for copy_id, block_ids in meta.saves:
            self._save(copy_id, block_ids)
        for copy_id, first, dst in meta.loads:
            self._load(copy_id, first, dst)
        for copy_id in meta.discards:
            if self._host.pop(copy_id, None) is not None:
                self._host_changed = True

    def _save(self, copy_id: int, block_ids: list[int]) -> None:
        t0 = time.perf_counter()
        try:
            idx = torch.tensor(block_ids, dtype=torch.long)
            copy = {name: kv.index_select(0, idx.to(kv.device)).to("cpu")
                    for name, kv in self._layers.items()}
        except Exception as exc:  # reported to the client, never a dead engine
            logger.exception("%s: save of copy %d failed", type(self).__name__, copy_id)
            self._saved[copy_id] = {"bytes": 0, "ms": 0.0, "error": f"{type(exc).__name__}: "
                                    f"{exc}"[:300]}
            return
        self._host[copy_id] = copy
        self._host_changed = True
        self._saved[copy_id] = {"bytes": sum(t.numel() * t.element_size()
                                             for t in copy.values()),
                                "ms": (time.perf_counter() - t0) * 1e3, "error": None}

    def _load(self, copy_id: int, first: int, dst: list[int]) -> None:
        copy = self._host.pop(copy_id, None)
        self._host_changed = True
        if copy is None or not dst:
            self._load_errors.update(dst)  # the scheduler recomputes these blocks
            return
        t0 = time.perf_counter()
        idx = torch.tensor(dst, dtype=torch.long)
        for name, kv in self._layers.items():
            part = copy[name][first:first + len(dst)]
            kv.index_copy_(0, idx.to(kv.device), part.to(kv.device))
            self._loaded[0] += part.numel() * part.element_size()
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the copy's time, not its launch's
        self._loaded[1] += (time.perf_counter() - t0) * 1e3

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are done whole in start_load_kv, before the step's forward."""

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        """Nothing is saved per layer: offloads copy whole blocks at a step's start."""

    def wait_for_save(self) -> None:
        """Copies are synchronous."""

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self) -> HarnessPauseWorkerMetadata | None:
        if not self._saved and not self._host_changed:
            return None
        meta = HarnessPauseWorkerMetadata(self._saved, sum(
            t.numel() * t.element_size() for copy in self._host.values() for t in copy.values()),
            int(self._loaded[0]), float(self._loaded[1]))
        self._saved, self._host_changed, self._loaded = {}, False, [0, 0.0]
        return meta


def _bytes_per_block(kv_cache_config: Any) -> int:
    """Every layer's K and V of one block (0 where the config is not known)."""
    if kv_cache_config is None:
        return 0
    return sum(int(g.kv_cache_spec.page_size_bytes) * len(g.layer_names)
               for g in kv_cache_config.kv_cache_groups)
