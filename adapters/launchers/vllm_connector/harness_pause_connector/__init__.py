"""A vLLM KV connector that lets a client pin, unpin, offload, drop and release a paused
session's KV blocks, one pause at a time.

This package is put on the vLLM server's PYTHONPATH (its own folder, never the whole
`adapters/` folder, whose `http.py` would shadow the standard library) and loaded with
`--kv-transfer-config '{"kv_connector": "HarnessPauseConnector", "kv_connector_module_path":
"harness_pause_connector.connector", "kv_role": "kv_both", ...}'`. It runs inside vLLM's own
virtualenv and imports nothing of the harness.

The wire protocol (both ways under the key `harness_pause` of `kv_transfer_params`):

- A call of a session carries `{"session": S, "hold": bool}`. When it ends, its full, cached
  blocks are pinned for S if `hold` (replacing S's earlier pin), else S's pin is released to
  the engine's evictable cache. A host copy of S is loaded back into newly allocated blocks when
  S's next call is scheduled (its prompt must start with the copied tokens, under the same
  cache salt).
- A control request (a 1-token prompt, `max_tokens` 2) carries `{"op": OP, ...}` and answers in
  the non-streamed response's `kv_transfer_params`: `hold` (session, ttl_s: the pin's expiry),
  `unpin`, `offload` (session, name), `drop`, `release` (session), `release_all` (prefix) and
  `status` (prefix: every pin and host copy whose session starts with it).

Why requests carry the control channel: the scheduler (and its block pool) lives in vLLM's
engine-core process, which the API server reaches only by adding requests; `kv_transfer_params`
is the field vLLM hands from a request body to the connector and from the connector back into
the response. An op takes effect when the request is added (`on_new_request`), before it is
scheduled, so a release frees blocks even while the pool is full. The second generated token
is what lets an offload report its copy time: the worker's report of a step reaches the
scheduler after that step's finished requests were answered.

Every pin and every host copy expires (a server-side safety net against a client that died
without releasing), and host copies are bounded by a byte cap: an offload past it fails with
the reason and leaves the pin in place. Expiry is checked at every scheduler step and every
control request (an idle engine takes no steps; the next request of anyone frees what expired).
"""
