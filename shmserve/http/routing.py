"""Which handler serves a request path: patterns such as `/v2/models/{model}/versions/
{version:[0-9]+}/infer`, one per route, matched a path segment at a time."""

import re
from urllib.parse import unquote


class NotFound(Exception):
    pass


class MethodNotAllowed(Exception):
    pass


# Paths resolved to a route before, up to this many: clients use a handful, so nearly every
# request is one dict lookup. The cache is emptied when full, so a client sending random paths
# costs only misses. Paths that match no route, and long ones, are not kept: a stream of
# 404s must not fill memory (URLs may be 64 KiB).
_CACHE_SIZE = 4096
_CACHED_PATH_CHARS = 1024


class Router:
    def __init__(self):
        # By segment count: [(segments, {method: handler})], in the order routes were added.
        # A segment is a literal str or a (name, compiled pattern or None) pair.
        self._routes: dict = {}
        self._cache: dict = {}

    def add(self, method: str, pattern: str, handler) -> None:
        segments = tuple(_segment(s) for s in pattern.split("/"))
        routes = self._routes.setdefault(len(segments), [])
        for existing, methods in routes:
            if existing == segments:
                methods[method] = handler
                break
        else:
            routes.append((segments, {method: handler}))
        self._cache.clear()

    def resolve(self, method: str, path: str):
        """(handler, match_info) for a request; match_info maps each {name} to its decoded
        path segment. HEAD is served by the GET handler."""
        hit = self._cache.get(path)
        if hit is None:
            hit = self._match(path)
            if hit[0] and len(path) <= _CACHED_PATH_CHARS:
                if len(self._cache) >= _CACHE_SIZE:
                    self._cache.clear()
                self._cache[path] = hit
        methods, match_info = hit
        handler = methods.get(method)
        if handler is None:
            if method == "HEAD" and "GET" in methods:
                return methods["GET"], match_info
            if methods:
                raise MethodNotAllowed(method)
            raise NotFound(path)
        return handler, match_info

    def _match(self, path: str):
        parts = path.split("/")
        for segments, methods in self._routes.get(len(parts), ()):
            match_info = {}
            for segment, part in zip(segments, parts):
                if type(segment) is str:
                    if segment != part:
                        break
                    continue
                if not part:
                    break
                value = unquote(part) if "%" in part else part
                name, check = segment
                if check is not None and not check.fullmatch(value):
                    break
                match_info[name] = value
            else:
                return methods, match_info
        return {}, {}


def _segment(text: str):
    if not (text.startswith("{") and text.endswith("}")):
        return text
    name, _, pattern = text[1:-1].partition(":")
    return name, re.compile(pattern) if pattern else None
