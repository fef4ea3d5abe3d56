from gateway.compat.common import rows as compat_rows  # noqa: F401 - its tables are ours too
from gateway.models import Base
from services.common.alembic_env import run_migrations

run_migrations(Base.metadata, "alembic_version_gateway")
