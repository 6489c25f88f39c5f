"""Operations on the ORM, one module per resource (the layer between schemas and routes)."""
