"""Where the remote server's settings live: its address and model in the settings (AppSettings
remote_url / remote_model), its API key in a file of its own in the data folder
(app/remote.py: mode 0600), never in the chats database. Qt-free."""

from __future__ import annotations

import logging

from merlin.app.model.paths import data_dir
from merlin.app.model.remote import RemoteConfig, load_api_key, save_api_key

from .i18n import tr

log = logging.getLogger(__name__)


def remote_config(settings) -> RemoteConfig:
    return RemoteConfig(settings.remote_url, load_api_key(data_dir()), settings.remote_model)


def remember_remote(settings, config: RemoteConfig) -> None:
    """Keep the server's address and model in `settings` (the caller saves them) and its key
    in the key file."""
    settings.remote_url = config.base_url
    settings.remote_model = config.model
    try:
        save_api_key(data_dir(), config.api_key)
    except OSError as e:  # the key is still used now, only not remembered
        log.warning("the API key could not be saved: %s", e)


def remote_panel_text(model: str, url: str) -> str:
    return "\n".join(
        [
            f"{model} · {url}",
            tr(
                "Remote server: time to first token, tokens/s and tokens in/out are measured from "
                "its stream and usage. The GEMM/attention split and speculative statistics are "
                "not available remotely."
            ),
        ]
    )
