"""How sure a prediction is: the committed held-out figures, read as package data, and the
one-line message built from them."""

from __future__ import annotations

import json
from importlib import resources

from search.prices.accuracy import Accuracy, HeldOut, confidence, load_accuracy


def test_the_committed_file_loads_and_says_what_is_not_measured():
    raw = json.loads(resources.files("search.prices").joinpath("accuracy.json").read_text())
    assert set(raw) >= {"catalog", "profile"}
    acc = load_accuracy()
    assert acc.profile.command == "python bench/cost_model_accuracy.py --held-out"
    for kind in ("catalog", "profile"):
        held = getattr(acc, kind)
        c = confidence(kind, "gpt2", 8, accuracy=Accuracy(**{kind: held}))
        if held.time is None and held.memory is None:
            assert "not measured yet" in c.message


def test_a_measured_band_is_quoted():
    acc = Accuracy(profile=HeldOut(time=0.12, memory=0.034, plans=40, machine="8x H100", date="2026-11-01"))
    c = confidence("profile", accuracy=acc)
    assert c.priced_from == "profile" and (c.time_error, c.memory_error) == (0.12, 0.034)
    assert c.message == ("priced from a profile: held-out error median ±12% time, ±3.4% memory "
                         "(40 plans, 8x H100, 2026-11-01)")


def test_the_catalog_hint_names_real_profile_flags():
    from paretoplan.cli import _parser

    c = confidence("catalog", "gpt2", 16, accuracy=Accuracy())
    assert c.priced_from == "catalog" and c.message.startswith("priced from the catalog (no profile of this machine")
    cmd = c.message.split("`")[1]
    assert cmd == "paretoplan profile --model gpt2 --devices 16 --out P.json"
    args = _parser().parse_args(cmd.split()[1:])  # the flags exist and parse
    assert (args.model, args.devices, args.out) == ("gpt2", 16, "P.json")
    search = _parser().parse_args(["search", "--model", "gpt2", "--profile", "P.json"])
    assert search.profile == "P.json"  # "pass --profile P.json"
    assert "POST /api/profiles" in confidence("catalog", via="api").message
