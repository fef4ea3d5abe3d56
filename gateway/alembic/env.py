from gateway.models import Base
from services.common.alembic_env import run_migrations

run_migrations(Base.metadata, "alembic_version_gateway")
