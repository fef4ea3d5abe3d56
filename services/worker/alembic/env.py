from services.common.alembic_env import run_migrations
from services.worker.models import VERSION_TABLE, Base

run_migrations(Base.metadata, VERSION_TABLE)
