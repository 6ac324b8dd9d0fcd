"""The one prompt-delta rule of every importer whose source reports whole prompts.

A source (an agent log, a recording, a trace of requests) says how long each call's prompt P
was; the trajectory format says what each LLM step appends to the context and, on a cut, how
many leading tokens it keeps first. `prompt_step` turns one into the other so that the replayed
prompt is exactly P: with nothing cut the step appends P less the context before it (the
previous prompt and output), else P less what it keeps. `cut_keep` is the estimate of what a
cut keeps where the source does not say (agent logs): the previous prompt when P still holds
it (output that was not sent back, e.g. thinking), else what the provider's cache served.
Importers whose source names the shared blocks (recordings, kv-cache-tester) count the kept
tokens from the blocks (`Response.keep`), which the builder hands to `prompt_step`.
"""

from __future__ import annotations

from harness.traces.importers._common import LLM

KEEP_NONE, KEEP_CACHED, KEEP_PREVIOUS_PROMPT = "none", "cached", "previous_prompt"


def prompt_step(prompt: int, output: int, before: int, keep: int | None = None) -> LLM:
    """The LLM step of a call whose prompt is `prompt` tokens: it appends `prompt - before`
    (the context before it) when `keep` is None, else keeps `keep` leading tokens and appends
    the rest."""
    if keep is None:
        return LLM(prompt - before, output)
    return LLM(prompt - keep, output, keep)


def cut_keep(prompt: int, prev_prompt: int, before: int, cached: int | None
             ) -> tuple[int, str]:
    """What a call whose prompt is below the context before it (`before`: the previous prompt
    and output) keeps, and why: the cached tokens, raised to the previous prompt `prev_prompt`
    when the prompt still holds it (0: a declared cut, where only the cache says what stayed);
    never more than either the prompt or the context."""
    keep, how = 0, KEEP_NONE
    if cached:
        keep, how = cached, KEEP_CACHED
    if prev_prompt and prompt >= prev_prompt > keep:
        keep, how = prev_prompt, KEEP_PREVIOUS_PROMPT
    return min(keep, prompt, before), how
