"""Block reuse over two block families (search/algorithm/families.py): FT on an encoder-decoder,
each stack's template solved once with the encoder output as a side input of every decoder
layer, equals the exhaustive reference under the same per-family tie; each point re-costs to
itself with every op priced."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from search.algorithm.families import find_families
from search.models.capture import capture_module
from search.models.seq2seq import annotate_stacks
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import Mesh, MeshAxis
from tests.search.algorithm.tied_exact import assert_ft_equals_exhaustive

DIM, BATCH = 16, 8


class _Cross(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(DIM, DIM, bias=False)
        self.b = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(memory)


class _EncDec(nn.Module):
    def __init__(self, enc: int, dec: int) -> None:
        super().__init__()
        self.enc_in = nn.Linear(DIM, DIM, bias=False)
        self.dec_in = nn.Linear(DIM, DIM, bias=False)
        self.encoder = nn.ModuleList([nn.Linear(DIM, DIM, bias=False) for _ in range(enc)])
        self.decoder = nn.ModuleList([_Cross() for _ in range(dec)])

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        h = self.enc_in(src)
        for layer in self.encoder:
            h = layer(h)
        y = self.dec_in(tgt)
        for layer in self.decoder:
            y = layer(y, h)
        return (y * y).mean()


def _graph(enc: int, dec: int):
    with torch.device("meta"):
        m = _EncDec(enc, dec)
        x = torch.empty(BATCH, DIM)
    g = capture_module(m, (x, x), "encdec", [["batch", "h"], ["batch", "h"]])
    return annotate_stacks(g, ("encoder", "decoder"), (enc, dec))


def test_both_stacks_are_families_the_decoder_reading_the_encoder_output() -> None:
    g = _graph(3, 3)
    fams = find_families(g)
    assert [f.block for f in fams] == [0, 1]
    assert fams[1].sides == (g.blocks[0].layers[-1][-1],)


@pytest.mark.parametrize("enc,dec,devices,recompute", [(3, 3, 4, True), (4, 3, 4, False), (3, 4, 8, False)])
def test_ft_with_families_equals_the_tied_exhaustive(enc: int, dec: int, devices: int, recompute: bool) -> None:
    g = _graph(enc, dec)
    cluster = make_cluster("h100-80gb", devices, devices_per_node=devices)
    job = TrainingJob(global_batch=BATCH, precision="bf16")
    meshes = (Mesh(pp=1, axes=(MeshAxis("dp", devices, 1, "data"), MeshAxis("tp", 1, 1, "tensor"))),)
    ft = assert_ft_equals_exhaustive(g, cluster, job, meshes, recompute)
    assert ft.stats["block_reuse"] and ft.stats["layers_solved_once"] == enc + dec - 2
