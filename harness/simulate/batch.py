"""The cost of one llama.cpp server iteration over its slots, micro-batch by micro-batch.

llama.cpp's server builds one batch per iteration: the next token of every generating slot (in
slot order), then prompt tokens of the slots still processing their prompt (in slot order) up to
`batch_tokens`. With one KV stream per slot (`kv_unified = false`, the default with `-np N`),
llama_decode splits that batch with `split_equal(n_ubatch, sequential)`: a micro-batch takes the
first slot with tokens left, then each later slot whose id is one more than the last taken, and
the same number of tokens from each of them (their fewest, at most n_ubatch / slots taken). Each
micro-batch is one forward pass (`alpha`); a slot's rows in it attend its own cache tiled when
there are at least `tiled_rows` of them, row by row otherwise (harness.model.iteration). So a
decode token next to a prompt, or the short tail of a prompt that shares micro-batches with
another, runs at the row-by-row cost.
"""

from __future__ import annotations

from harness.model.iteration import IterationCosts


def slot_iteration_s(costs: IterationCosts, decode: list[tuple[int, float]],
                     prompts: list[tuple[int, int, int]]) -> float:
    """Seconds for one iteration: `decode` (slot, cost of its token without alpha) and
    `prompts` (slot, tokens in this iteration, position of the first), each sorted by slot."""
    if not prompts:  # decode only: one pass per run of consecutive slot ids
        s = 0.0
        prev = -2
        for sl, d in decode:
            if sl != prev + 1:
                s += costs.alpha
            s += d
            prev = sl
        return s
    # (slot, tokens left, position, decode cost or -1 for a prompt) in batch order
    segs: list[list[float]] = ([[sl, 1, 0, d] for sl, d in decode]
                               + [[sl, m, p, -1.0] for sl, m, p in prompts])
    alpha, beta, a_t, a_r = costs.alpha, costs.beta, costs.a_tiled, costs.a_row
    tiled, ubatch = costs.tiled_rows, costs.ubatch_tokens
    total = 0.0
    left = len(segs)
    while left:
        chosen: list[list[float]] = []
        last = -2.0
        for seg in segs:
            if seg[1] and (not chosen or seg[0] == last + 1):
                chosen.append(seg)
                last = seg[0]
        k = int(min(min(seg[1] for seg in chosen), max(1, ubatch // len(chosen))))
        total += alpha
        for seg in chosen:
            if seg[3] >= 0:
                total += seg[3]
            else:
                a = a_t if k >= tiled else a_r
                total += k * beta + a * (k * seg[2] + k * (k + 1) * 0.5)
                seg[2] += k
            seg[1] -= k
            if not seg[1]:
                left -= 1
    return total
