"""What the harness does to a trajectory's KV on the server: take a slot, swap it out or discard
it at a pause, bring it back for the next call, and release everything when the trajectory
ends; plus the names it gives the server-side state it creates (cache salts, dump files), and
the server rates it learns from what those actions cost.
"""

from __future__ import annotations

import hashlib
import re

from harness.adapters.base import PausedKv, Unsupported
from harness.policies.base import KEEP, KEEP_EVICTABLE, RECOMPUTE, SWAP, ServerRates
from harness.records.kinds import Erase, KvState, Recompute, SlotWait, SwapIn, SwapOut
from harness.replay.clock import NS
from harness.replay.context import ReplayContext, TrajectoryState

MIN_PREFILL_SAMPLE = 64  # prompts shorter than this time overheads, not prefill

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


# ---- names of server-side state -----------------------------------------------------------
# Each unique per pause of a trajectory and made of characters every server accepts.
def safe_key(run_id: str, trajectory_id: str, step: int) -> str:
    """A key for one pause of one trajectory that servers accept as a name: letters, digits,
    '-' and '_' only (a sub-agent's id has '/', which vLLM refuses in a cache salt and a
    server refuses in a file name), at most ~100 characters, unique per trajectory (a short
    hash of its raw id)."""
    digest = hashlib.blake2b(trajectory_id.encode(), digest_size=4).hexdigest()
    slug = _UNSAFE.sub("_", trajectory_id)[:40]
    return f"{_UNSAFE.sub('_', run_id)[:48]}-{slug}-{digest}-{step}"


def cache_salt(run_id: str, trajectory_id: str, step: int) -> str:
    """A fresh cache salt for one pause: `run-trajectory-step` as it is where that is a name
    servers accept (at most 128 of letters, digits, '-' and '_'), else `safe_key`'s."""
    plain = f"{run_id}-{trajectory_id}-{step}"
    return plain if len(plain) <= 128 and not _UNSAFE.search(plain) else safe_key(
        run_id, trajectory_id, step)


def dump_name(run_id: str, trajectory_id: str, step: int) -> str:
    """A swap dump's file name (no dots but its suffix, so no '..' a server would refuse)."""
    return safe_key(run_id, trajectory_id, step) + ".bin"


# ---- the pause actions, through the adapter's seam ----------------------------------------
def paused_kv(st: TrajectoryState) -> PausedKv:
    """What the adapter is told about the trajectory's context (and the pause whose hint it
    carries)."""
    return PausedKv(st.tid, st.slot, len(st.context), st.hint_step)


async def acquire(ctx: ReplayContext, st: TrajectoryState, step: int,
                  traffic: str = "agent") -> None:
    """Take a slot for `st` if the harness manages slots and it holds none; a wait for one
    (every slot taken) is recorded."""
    if ctx.pool is None or st.slot is not None:
        return
    t0 = ctx.clock.now_ns()
    contended = ctx.pool.free == 0
    st.slot = await ctx.pool.acquire()
    if contended:
        ctx.rec.emit(SlotWait(trajectory_id=st.tid, traffic=traffic, step=step,
                              slot=st.slot, slot_wait_s=(ctx.clock.now_ns() - t0) / NS))


async def restore(ctx: ReplayContext, st: TrajectoryState, step: int) -> None:
    """Before a call: get a slot back and bring the offloaded context into it, or, when the
    KV was discarded, record that the call re-prefills the context."""
    had_slot = st.slot is not None
    await acquire(ctx, st, step)
    if st.dump is not None and (st.slot is not None or ctx.pool is None):
        io = await ctx.adapter.restore(paused_kv(st), st.dump)
        if io is not None:
            ctx.rec.emit(SwapIn(trajectory_id=st.tid, traffic="agent", step=step,
                                slot=st.slot, bytes=io.bytes, server_ms=io.ms,
                                retained_tokens=io.tokens))
            if io.ms > 0 and io.bytes > 0:
                _learn_swap(ctx, io.bytes, io.ms)
        else:  # restored by the server on the call itself; its time is in the call's
            ctx.rec.emit(SwapIn(trajectory_id=st.tid, traffic="agent", step=step,
                                retained_tokens=len(st.context), detail="on the resumed call"))
        await delete_dump(ctx, st)
    elif not had_slot and st.context and ctx.pool is not None:
        ctx.rec.emit(Recompute(trajectory_id=st.tid, traffic="agent", step=step,
                               recomputed_tokens=len(st.context)))


async def hold(ctx: ReplayContext, st: TrajectoryState, ttl_s: float | None) -> None:
    """Keep the paused context pinned (the server holds it out of its eviction)."""
    if ctx.holds_kv(st):
        await ctx.adapter.hold(paused_kv(st), ttl_s)
        st.pinned = True


async def evict(ctx: ReplayContext, st: TrajectoryState, action: str, step: int,
                reason: str) -> None:
    """Offload, drop or unpin this trajectory's KV, and give its slot back."""
    st.pinned = False
    if ctx.pool is None:
        await _evict_unslotted(ctx, st, action, step, reason)
        return
    if st.slot is None:
        return
    if action == SWAP:
        if not await _swap_out(ctx, st, step, reason):
            return  # the server cannot save it: the KV stays in its slot
    else:
        await ctx.adapter.drop(paused_kv(st))
    ctx.rec.emit(Erase(trajectory_id=st.tid, traffic="agent", step=step, slot=st.slot,
                       reason=reason))
    await ctx.pool.release(st.slot)
    st.slot = None
    ctx.rec.emit(KvState(trajectory_id=st.tid, traffic="agent", kv_tokens=0,
                         status="released"))


async def _evict_unslotted(ctx: ReplayContext, st: TrajectoryState, action: str, step: int,
                           reason: str) -> None:
    """The server manages its memory: tell it what the pause decided."""
    if action == RECOMPUTE:
        await ctx.adapter.drop(paused_kv(st))
        # A fresh cache salt forbids reuse of whatever of the old prefix stays cached.
        st.salt = cache_salt(ctx.run_id, st.tid, step)
        ctx.rec.emit(Erase(trajectory_id=st.tid, traffic="agent", step=step,
                           reason=f"{reason}: fresh cache salt"))
        ctx.rec.emit(Recompute(trajectory_id=st.tid, traffic="agent", step=step,
                               recomputed_tokens=len(st.context)))
    elif action == SWAP:
        if await _swap_out(ctx, st, step, reason):
            ctx.rec.emit(KvState(trajectory_id=st.tid, traffic="agent", kv_tokens=0,
                                 status="released"))
        elif KEEP in ctx.adapter.capabilities.pause_actions:
            # The server refused (its host memory is full): the context stays pinned for the
            # rest of the pause, not just until the safety net a TTL's hold set.
            await ctx.adapter.hold(paused_kv(st), None)
            st.pinned = True
    elif action == KEEP_EVICTABLE:
        prefilled = await ctx.adapter.unpin(paused_kv(st))
        # Where leaving a pinned context to the cache costs a prefill (SGLang frees a closed
        # session's KV but its first prompt), the event says how much.
        ctx.rec.emit(KvState(trajectory_id=st.tid, traffic="agent",
                             kv_tokens=len(st.context), status="evictable",
                             detail=f"{prefilled} tokens prefilled again to leave it cached"
                             if prefilled else None))


async def _swap_out(ctx: ReplayContext, st: TrajectoryState, step: int, reason: str) -> bool:
    """Offload the context; False (recorded as unsupported) when the server can't."""
    name = dump_name(ctx.run_id, st.tid, step)
    try:
        io = await ctx.adapter.offload(paused_kv(st), name)
    except Unsupported as exc:
        ctx.counters.outcome.unsupported_actions += 1
        ctx.rec.emit(SwapOut(trajectory_id=st.tid, traffic="agent", step=step,
                             slot=st.slot, status="unsupported", detail=str(exc)[:300]))
        ctx.hints.rejected(st.tid, step, str(exc))
        return False
    st.dump = name
    ctx.rec.emit(SwapOut(trajectory_id=st.tid, traffic="agent", step=step, slot=st.slot,
                         bytes=io.bytes, server_ms=io.ms, retained_tokens=io.tokens, reason=reason))
    return True


async def delete_dump(ctx: ReplayContext, st: TrajectoryState) -> None:
    """Forget the trajectory's offloaded copy; a dump file that cannot be deleted is named in
    the counters (run.json), never silently left behind."""
    if st.dump is None:
        return
    name, st.dump = st.dump, None
    if not ctx.adapter.capabilities.dump_files:
        return  # held in the server's memory: restore and release free it
    if not ctx.adapter.capabilities.local_dump_files:
        # On a remote server's disk, which no server API lets the client delete: named in
        # run.json (cleanup.remote_dumps_left) so its owner can.
        ctx.counters.remote_dumps_left.append(name)
    elif not await ctx.adapter.delete_dump(name):
        ctx.counters.cleanup_errors.append(f"dump file {name} still exists")


async def free_slot(ctx: ReplayContext, st: TrajectoryState, reason: str,
                    traffic: str) -> None:
    """Release the request's context on the server (recorded) and give its slot back to the
    pool, even when the release fails."""
    if st.slot is None or ctx.pool is None:
        return
    slot = st.slot
    try:
        await ctx.adapter.release(paused_kv(st))
        ctx.rec.emit(Erase(trajectory_id=st.tid, traffic=traffic, slot=slot, reason=reason))
    finally:
        st.slot = None
        await ctx.pool.release(slot)


async def release(ctx: ReplayContext, st: TrajectoryState, reason: str) -> None:
    """Free the slot, whatever the server holds for the trajectory, and any dump file: runs
    on every trajectory end."""
    try:
        if ctx.pool is None:
            await ctx.adapter.release(paused_kv(st))
        else:
            await free_slot(ctx, st, reason, "agent")
        await delete_dump(ctx, st)
    except Exception as exc:
        ctx.counters.cleanup_errors.append(f"{st.tid}: {type(exc).__name__}: {exc}")
    ctx.rec.emit(KvState(trajectory_id=st.tid, traffic="agent", kv_tokens=0,
                         status="released"))


# ---- rates learned from what the server did -----------------------------------------------
# Moving averages (0.7 old, 0.3 new), so later pauses decide on what this server does now.
def learn_prefill(ctx: ReplayContext, prompt_n: int | None, prompt_ms: float | None) -> None:
    """Fold a call's measured prefill speed into the rates the policy sees."""
    if prompt_n and prompt_ms and prompt_n >= MIN_PREFILL_SAMPLE and prompt_ms > 0:
        measured = prompt_n / (prompt_ms / 1000.0)
        ctx.rates = ServerRates(0.7 * ctx.rates.prefill_tok_s + 0.3 * measured,
                                ctx.rates.swap_bytes_per_s, ctx.rates.kv_bytes_per_token)


def _learn_swap(ctx: ReplayContext, nbytes: int, ms: float) -> None:
    ctx.rates = ServerRates(ctx.rates.prefill_tok_s,
                            0.7 * ctx.rates.swap_bytes_per_s + 0.3 * nbytes / (ms / 1000.0),
                            ctx.rates.kv_bytes_per_token)
