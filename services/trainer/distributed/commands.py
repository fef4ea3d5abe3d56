"""What the coordinator and its ranks say to each other: the configuration a rank is given
when it starts, and how it finds its end of the channel. Commands are tuples, sent in order:
("create", spec), ("call", model id, method, args) and ("run", model id, function, args) (a
function of `rank.FUNCTIONS` on the model); None tells a rank to leave."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.trainer.distributed.sharding import Sharding

# The rank's number, and the file descriptor of its end of the coordinator's socket pair.
RANK_ENV, CHANNEL_ENV = "LOOM_TRAINER_RANK", "LOOM_TRAINER_RANK_CHANNEL"
# A rank's exit code when the coordinator refuses it (another service token): its node agent
# stops rather than start it again and again.
REFUSED = 2


@dataclass(frozen=True)
class RankConfig:
    """What every rank of a group is told when it starts."""

    world_size: int
    master_port: int
    data_dir: Path
    device: str
    micro_batch_tokens: int | None
    threads: int
    sharding: Sharding
    timeout_s: float
    # Where rank 0 hosts torch's rendezvous (a TCPStore): an address every host reaches.
    master_addr: str = "127.0.0.1"
