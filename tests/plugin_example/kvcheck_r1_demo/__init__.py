"""An out-of-tree kvcheck target in one file: ``--target r1demo`` for the radix variant.

A real plug-in would wrap its engine's cache here (see kvcheck's docs/adapters.md); this one
wraps kvcheck's reference radix cache with catalogued fault R1 (``_add_leaf`` subtracts the
parent's size: evictable + protected drifts from the tree's size), so every kvcheck command
run on it must report size-accounting.
"""

from pathlib import Path

from caches.faults import get_fault
from caches.subjects.radix import RadixSubject
from caches.target import DECLINE, Identity, Target, content_hash

VERSION = "0.1.0"


def build_radix(params, *, fault=None, device=None, src=None, known_findings=DECLINE):
    """The subject: kvcheck's radix driver over our (broken) cache and its own token pool."""
    if fault is not None:
        from caches.target import FaultNotInjectable

        raise FaultNotInjectable(f"r1demo injects no catalogued faults (asked for {fault})")
    return RadixSubject(get_fault("R1").cls, page_size=params["page_size"],
                        pool_pages=params["pool_pages"], device=device)


def identify(src=None) -> Identity:
    return Identity("r1demo", VERSION, content_hash([Path(__file__)]))


TARGET = Target(name="r1demo", engine="r1demo",
                summary="example plug-in: the reference radix cache with R1 switched on",
                builders={"radix": build_radix}, identify=identify)
