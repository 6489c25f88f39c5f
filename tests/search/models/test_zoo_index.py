"""The committed zoo index (what GET /api/models serves without building a model) is the zoo's own
listing: a model added or changed without `python -m search.models.zoo_index` fails here."""

from __future__ import annotations

from search.models import zoo_index


def test_the_committed_index_is_what_the_zoo_computes():
    assert zoo_index.load() == zoo_index.build(), "run `python -m search.models.zoo_index` and commit zoo_index.json"
