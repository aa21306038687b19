"""--allowed-media-domains holds across redirects: an allow-listed host that answers with a
redirect to a host off the list (an internal address, say) must not make the server fetch it
(server-side request forgery). A local HTTP server plays both hosts: 127.0.0.1 is allowed,
"localhost" (the same machine under another name) is not."""

from __future__ import annotations

import http.server
import io
import threading
from typing import Any, Iterator

import pytest
from support.deps import need
from support.images import random_image

need("PIL")

from pagedkv.engine.multimodal import load_image_url  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    png = io.BytesIO()
    random_image(3, 8, 8).save(png, format="PNG")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.startswith("/to/"):  # /to/<host>: a redirect to <host>'s image
                host = self.path[len("/to/") :]
                self.send_response(302)
                self.send_header("Location", f"http://{host}:{port}/image.png")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(png.getvalue())

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    httpd.shutdown()


def test_an_allowed_host_is_fetched(server: str) -> None:
    assert load_image_url(server + "/image.png", "part", ["127.0.0.1"]).size == (8, 8)
    # A redirect that stays on the allowed hosts is followed.
    assert load_image_url(server + "/to/127.0.0.1", "part", ["127.0.0.1"]).size == (8, 8)


def test_a_redirect_off_the_allow_list_is_refused(server: str) -> None:
    with pytest.raises(ValueError, match="redirect.*'localhost'.*--allowed-media-domains"):
        load_image_url(server + "/to/localhost", "part", ["127.0.0.1"])
