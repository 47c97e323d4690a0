"""Offline from the first cell: a Python started with this folder on PYTHONPATH refuses every network connection
except to this machine (loopback). `python llmwalk_setup.py test` puts it there, so pytest, its workers, the
notebook kernels nbval starts and the JupyterLab of the browser test all inherit it. Names are refused before they are
looked up and addresses before anything is sent, so a refused connection makes no traffic at all. It covers
Python's socket module (what urllib, requests, httpx and huggingface_hub use), not native libraries' own sockets.
"""
import ipaddress
import socket


class OfflineError(ConnectionRefusedError):
    """An OSError, so code that handles a failed connection (e.g. llmwalk's Hub loader) handles this one too."""


LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def is_local(host) -> bool:
    if host is None or host in ("", b""):           # a server's wildcard lookup, e.g. getaddrinfo(None, port)
        return True
    host = (host.decode() if isinstance(host, bytes) else str(host)).split("%")[0].lower()   # drop an IPv6 scope
    if host in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False                                # any other name would go to a DNS server


def refuse_unless_local(host) -> None:
    if not is_local(host):
        raise OfflineError(f"llmwalk's tests run offline: refused a connection to {host!r} "
                           f"(tests/offline/sitecustomize.py allows only this machine)")


def _guard(real, host_of):
    def guarded(*args, **kwargs):
        refuse_unless_local(host_of(args))
        return real(*args, **kwargs)
    return guarded


def _address_host(address):
    return address[0] if isinstance(address, tuple) else None     # AF_UNIX addresses are paths: local


socket.socket.connect = _guard(socket.socket.connect, lambda a: _address_host(a[1]))
socket.socket.connect_ex = _guard(socket.socket.connect_ex, lambda a: _address_host(a[1]))
socket.socket.sendto = _guard(socket.socket.sendto, lambda a: _address_host(a[-1]))   # sendto(data[, flags], address)
socket.getaddrinfo = _guard(socket.getaddrinfo, lambda a: a[0])   # create_connection and asyncio look names up here
