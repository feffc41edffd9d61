"""The legacy fast path (`runtime/network/flower.py`) lives only while flwr ships it, and
Flower's deprecation banner (which tells a silo's operator to run `--insecure`) never
reaches the operator."""

import contextlib
import importlib.metadata
import logging
import socket

from packaging.version import Version

from silofl.runtime.network import flower as legacy


def test_legacy_fast_path_is_still_shipped_by_this_flwr():
    """Fails on the flwr release that passes the bound or drops the entry points: then
    remove `runtime/network/flower.py`'s legacy path (run_silo/run_server) and its
    benchmark row; the SuperLink/SuperNode route is the only one."""
    import flwr.client
    from flwr.server.superlink.fleet.grpc_bidi import grpc_server
    installed = Version(importlib.metadata.version("flwr"))
    bound = Version(".".join(map(str, legacy.LEGACY_FLWR_BELOW)))
    assert installed < bound, (
        f"flwr {installed} is past the legacy fast path's bound {bound} "
        "(LEGACY_FLWR_BELOW in runtime/network/flower.py): check that start_client and "
        "start_grpc_server still exist and behave, then raise the bound, or remove the path")
    assert hasattr(flwr.client, "start_client"), (
        "flwr no longer ships flwr.client.start_client: remove the legacy fast path "
        "(runtime/network/flower.py run_silo/run_server); use the SuperLink route")
    assert hasattr(grpc_server, "start_grpc_server"), (
        "flwr no longer ships start_grpc_server: remove the legacy fast path")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_start_client_deprecation_banner_never_reaches_the_operator():
    """Flower's real start_client, as `silofl silo` calls it, against a port nobody
    serves: every record that reaches Flower's handlers is collected; the `--insecure`
    banner is not among them, while Flower's own connection messages still are."""
    import flwr.client
    from flwr.common import logger as flwr_logger
    seen = _Collect()
    flwr_logger.FLOWER_LOGGER.addHandler(seen)
    try:  # nobody answers: start_client gives up after one retry (returns or raises)
        with contextlib.suppress(Exception):
            flwr.client.start_client(server_address=f"127.0.0.1:{_free_port()}",
                                     client=legacy.SiloClient(None).to_client(),
                                     insecure=True, max_retries=1, max_wait_time=1.0)
    finally:
        flwr_logger.FLOWER_LOGGER.removeHandler(seen)
    text = "\n".join(seen.lines)
    assert seen.lines, "Flower logged nothing: the test did not exercise start_client"
    assert "--insecure" not in text and "DEPRECATED FEATURE" not in text, text


def test_banner_filter_keeps_other_warnings():
    from flwr.common.logger import warn_deprecated_feature
    seen = _Collect()
    logging.getLogger("flwr").addHandler(seen)
    try:
        warn_deprecated_feature("flower-supernode --insecure")
        logging.getLogger("flwr").warning("round 3: silo b failed")
    finally:
        logging.getLogger("flwr").removeHandler(seen)
    assert seen.lines == ["round 3: silo b failed"]
