"""`python -m services.common.healthcheck <service>`: exit 0 when the service is ready.

The container images' HEALTHCHECK. An HTTP service is asked for `/readyz` at its own URL
setting (it binds to that URL's host, which in compose is the container's address, not
127.0.0.1); the Celery worker, which has no port, is ready while its ready file names a live
process.
"""

from __future__ import annotations

import os
import sys

import httpx2

from services.common.settings import SERVICES, LoomSettings

TIMEOUT_S = 5.0


def http_ready(service: str, settings: LoomSettings) -> bool:
    try:
        return httpx2.get(f"{settings.url_of(service)}/readyz", timeout=TIMEOUT_S).is_success
    except httpx2.HTTPError:
        return False


def worker_ready() -> bool:
    try:
        pid = int(LoomSettings().ready_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in (*SERVICES, "worker"):
        print(
            f"usage: python -m services.common.healthcheck {{{'|'.join(SERVICES)}|worker}}",
            file=sys.stderr,
        )
        return 2
    service = argv[0]
    ready = worker_ready() if service == "worker" else http_ready(service, LoomSettings())
    return 0 if ready else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
