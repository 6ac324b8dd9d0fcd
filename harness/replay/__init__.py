"""Replay: an asyncio executor drives an adapter through a plan and writes event records."""
