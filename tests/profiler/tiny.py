"""The gpt2-tiny search every profiler test profiles and searches (2 devices in one node: meshes
dp2 and tp2, collectives over groups of 2)."""

from typing import TypedDict


class TinySearch(TypedDict):
    model: str
    devices: int
    devices_per_node: int
    global_batch: int


TINY = TinySearch(model="gpt2-tiny", devices=2, devices_per_node=2, global_batch=8)
