"""A TCP proxy a test can cut: every connection through it dropped and new ones refused until
it is restored, as a restarting server (or a network partition) looks to its clients."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.support.nats import free_port


class TcpProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.cut_off = False
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Drop every connection; refuse new ones until `restore`."""
        with self._lock:
            self.cut_off = True
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def restore(self) -> None:
        with self._lock:
            self.cut_off = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self.cut_off:
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError:
                    client.close()
                    continue
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
