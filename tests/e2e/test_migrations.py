# The schema the migrations build (what `fleetlm serve` applied) matches the SQLAlchemy models,
# and the demo key is stored only as a hash.
from __future__ import annotations

import json

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import select

from metering import batch_models  # noqa: F401 - the batch tables are on Base too
from metering.db import make_engine, make_sessionmaker
from metering.keys import find_principal, hash_key
from metering.models import ApiKey, Base


def test_migrated_schema_matches_the_models(server):
    urls = json.loads((server.data_dir / "services.json").read_text())
    engine = make_engine(urls["database_url"])
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
        with make_sessionmaker(engine)() as session:
            principal = find_principal(session, server.key)
            assert principal is not None and principal.tenant_name == "demo"
            stored = session.scalars(select(ApiKey.key_hash)).all()
            assert hash_key(server.key) in stored
            assert server.key not in stored
            assert find_principal(session, server.key + "x") is None
    finally:
        engine.dispose()
