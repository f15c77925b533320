"""ACME's gpudoctor rules. gpudoctor finds every rule in this module through the entry point
`acme = "acme_rules"` in the group `gpudoctor.rules` (pyproject.toml)."""

from acme_rules.loader_settings import loader_settings
from acme_rules.nfs_loader_wait import slow_loader_wait
from acme_rules.training_step_syncs import sync_in_training_step

__all__ = ["loader_settings", "slow_loader_wait", "sync_in_training_step"]
