"""The runtime of the classes of :mod:`switchboard.wire` (which scripts/generate_types.py
generates from docs/schema/*.json; this part is written by hand).

A wire object is the decoded JSON object itself, a ``dict``, with its fields readable as
attributes: ``answer.body`` is ``answer["body"]``. Everything a dict does still works
(indexing, ``.get``, ``json.dumps``, equality with the plain dict), so code written for the
plain replies keeps working. A field the reply left out reads as its default: the schema's
``default``, else what the fabric means by leaving it out (``[]``, ``{}``, ``False``, ``0``,
``""`` for a field that is never ``null``), else ``None``. A field named like a Python keyword
is read with a trailing underscore (``transition.from_`` is ``transition["from"]``). Nested
objects, and lists and maps of them, are made their classes when the object is built, and
again when a field is read after a plain dict was stored in it.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

W = TypeVar("W", bound="WireObject")


class ListOf:
    """Converts a list's items with ``item`` (a class or another converter)."""

    __slots__ = ("item",)

    def __init__(self, item: Any):
        self.item = item

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        items = [_convert(self.item, v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else items

    def __repr__(self) -> str:
        return f"ListOf({_name(self.item)})"


class MapOf:
    """Converts the values of a JSON object used as a map (``dict[str, X]``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, dict) or isinstance(value, WireObject):
            return value
        items = {k: _convert(self.value, v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items

    def __repr__(self) -> str:
        return f"MapOf({_name(self.value)})"


class Tagged:
    """A union of classes told apart by a tag field (``Part``: ``"type": "text"`` is a
    ``PartText``). An object with an unknown tag stays a plain dict."""

    __slots__ = ("tag", "classes")

    def __init__(self, tag: str, classes: Mapping[Any, type[WireObject]]):
        self.tag, self.classes = tag, dict(classes)

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, Mapping) or isinstance(value, WireObject):
            return value
        cls = self.classes.get(value.get(self.tag))
        return cls(value) if cls is not None else value

    def __repr__(self) -> str:
        return f"Tagged({self.tag!r}, {{{', '.join(f'{k!r}: {_name(c)}' for k, c in self.classes.items())}}})"


def _name(spec: Any) -> str:
    return spec.__name__ if isinstance(spec, type) else repr(spec)


def _convert(spec: Any, value: Any) -> Any:
    """``value`` as ``spec`` says: a class wraps a JSON object (a wire object stays as it is),
    a converter converts; anything else (``None``, a string) passes unchanged."""
    if isinstance(spec, type):
        if isinstance(value, Mapping) and not isinstance(value, WireObject):
            return spec(value)
        return value
    return spec(value)


class WireObject(dict[str, Any]):
    """A JSON object of the wire, read with attributes (see the module's description). The
    generated subclasses declare their fields as annotations; the tables below are generated
    with them."""

    __slots__ = ()

    #: attribute → key, for the fields whose attribute is not their key (``from_`` → ``from``).
    _keys: ClassVar[dict[str, str]] = {}
    #: key → the value of the field when the object leaves it out (``None`` when not listed).
    _defaults: ClassVar[dict[str, Any]] = {}
    #: key → how its nested objects are built (a class, ``ListOf``, ``MapOf``, ``Tagged``).
    _nested: ClassVar[dict[str, Any]] = {}
    #: attribute → key for every field (computed from the annotations).
    _fields: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            if issubclass(klass, WireObject):
                for name in inspect.get_annotations(klass):
                    if not name.startswith("_"):
                        fields[name] = cls._keys.get(name, name)
        cls._fields = fields

    def __init__(self, *args: Any, **fields: Any) -> None:
        """Like ``dict(...)``; keyword arguments are taken by attribute name (``from_=``
        stores ``"from"``). Nested objects become their classes (the input is not changed)."""
        super().__init__(*args, **{self._fields.get(k, k): v for k, v in fields.items()})
        for key, spec in self._nested.items():
            if key in self:
                value = dict.__getitem__(self, key)
                converted = _convert(spec, value)
                if converted is not value:
                    dict.__setitem__(self, key, converted)

    def _key(self, name: str) -> str:
        key = self._fields.get(name)
        if key is not None:
            return key
        if not name.startswith("_") and name in self:
            return name  # a key the schema does not know (from a newer fabric): readable too
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    if not TYPE_CHECKING:  # type checkers see the annotated fields only, so a typo is an error

        def __getattr__(self, name: str) -> Any:
            key = self._key(name)
            try:
                value = dict.__getitem__(self, key)
            except KeyError:
                default = self._defaults.get(key)
                return copy.deepcopy(default) if isinstance(default, (list, dict)) else default
            spec = self._nested.get(key)
            if spec is not None:
                converted = _convert(spec, value)
                if converted is not value:  # a plain dict stored since: keep it converted
                    dict.__setitem__(self, key, converted)
                    value = converted
            return value

        def __setattr__(self, name: str, value: Any) -> None:
            try:
                key = self._key(name)
            except AttributeError:
                raise AttributeError(
                    f"{type(self).__name__} has no field {name!r}; "
                    f"set a key outside the schema with obj[{name!r}] = …") from None
            self[key] = value

        def __delattr__(self, name: str) -> None:
            key = self._key(name)
            try:
                del self[key]
            except KeyError:
                raise AttributeError(name) from None

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._fields))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"

    def copy(self: W) -> W:
        """A shallow copy, of the same class."""
        return type(self)(self)


def parse(cls: type[W], value: Mapping[str, Any]) -> W:
    """``value`` (a decoded JSON object) as a ``cls``: ``parse(wire.CallAnswer, data)``. A
    ``cls`` already is returned as it is; a plain dict is copied, its nested objects made
    their classes."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"a {cls.__name__} is a JSON object, not {type(value).__name__}")
    return cls(value)
