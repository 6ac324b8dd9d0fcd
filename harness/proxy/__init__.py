"""`harness record`: a private recording proxy in front of an OpenAI- or Anthropic-compatible
server, and the recording it writes.

The proxy (proxy.py) forwards every request and stream unchanged and records, per call, what a
replay needs: times (arrival, first token, end), usage, the tool calls the model made and when
their results came back, and the shape of the context as salted block hashes (hashing.py), never
the text unless asked. Calls are joined into conversations and sub-agents as they end
(conversations.py) and written as they go to an append-only events file (store.py), which
`harness traces import recording DIR` turns into a trajectory file.
"""
