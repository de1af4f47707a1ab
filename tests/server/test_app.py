"""Starting a server: a taken port is refused, never shared."""

from __future__ import annotations

import pytest

from actstore.errors import Unavailable
from tests.conftest import make_settings


def test_a_second_server_on_a_taken_port_is_refused(server, tmp_path):
    from actstore.server.app import start_server

    with pytest.raises(Unavailable, match=f"cannot bind 127.0.0.1:{server.port}"):
        start_server(make_settings(tmp_path / "other-store", port=server.port))
