"""The HTTP layer: one router per resource under `routes/`, shared plumbing here."""
