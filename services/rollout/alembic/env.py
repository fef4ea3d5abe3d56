from services.common.alembic_env import run_migrations
from services.rollout.capture.models import Base

run_migrations(Base.metadata, "alembic_version_rollout")
