"""A TCP relay in front of a broker process, able to keep the broker's answers from its clients.

A broker advertised at the relay's port (``advertised.listeners``) gets every client connection
through it. ``hold_answers`` makes the relay read the broker's answers and keep them: the
requests were served (appended, for a Produce) but their clients never learn it, which is the
window a crash must hit for a retry to meet a batch already in the log. ``release`` drops what
was held and closes every client connection, as a crash of the broker would.
"""

from __future__ import annotations

import socket
import threading


class Relay:
    """Listens on 127.0.0.1:<ephemeral>; each connection is piped to 127.0.0.1:``upstream_port``."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.upstream_port = 0  # set once the broker has bound its port
        self.held_bytes = 0
        self._holding = threading.Event()
        self._lock = threading.Lock()
        self._clients: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="relay-accept").start()

    def hold_answers(self) -> None:
        """From now on, answers from the broker are read and kept from the clients."""
        self._holding.set()

    def release(self) -> None:
        """Drops the held answers and closes the clients' connections; new ones flow again."""
        with self._lock:
            clients, self._clients = self._clients, []
            self._holding.clear()
            self.held_bytes = 0
        for c in clients:
            _close(c)

    def close(self) -> None:
        self._closed = True
        _close(self._server)
        self.release()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._clients.append(client)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        """Copies source to sink until either end closes; then closes both."""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if answers and self._holding.is_set():
                    with self._lock:
                        self.held_bytes += len(data)
                    continue
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
