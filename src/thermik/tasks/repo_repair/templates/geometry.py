"""Template family `geometry` (training rows): its modules and the units each holds."""

from __future__ import annotations

import random

from thermik.tasks.repo_repair.templates.unit import Draw, Unit, unit


def _manhattan(r: random.Random) -> Unit:
    return unit(
        "manhattan",
        """
def manhattan(a, b):
    return abs(a[0] - b[0]) + abs(a[1] - b[1])
""",
        "the Manhattan distance between two points",
        "manhattan((0, 0), (3, 4))", "manhattan((1, 5), (4, 1))", "manhattan((2, 2), (2, 2))",
    )  # fmt: skip


def _rect_area(r: random.Random) -> Unit:
    return unit(
        "rect_area",
        """
def rect_area(corner, opposite):
    width = opposite[0] - corner[0]
    height = opposite[1] - corner[1]
    if width <= 0 or height <= 0:
        return 0
    return width * height
""",
        "the area of a rectangle given two corners",
        "rect_area((0, 0), (3, 4))", "rect_area((2, 2), (1, 5))", "rect_area((1, 1), (4, 2))",
    )  # fmt: skip


def _centroid(r: random.Random) -> Unit:
    return unit(
        "centroid",
        """
def centroid(points):
    if not points:
        return (0.0, 0.0)
    xs = sum((p[0] for p in points))
    ys = sum((p[1] for p in points))
    return (xs / len(points), ys / len(points))
""",
        "the centroid of a set of points",
        "centroid([(0, 0), (2, 0), (2, 2), (0, 2)])", "centroid([])", "centroid([(1, 5)])",
        "centroid([(0, 3), (6, 0)])",
    )  # fmt: skip


def _inside_circle(r: random.Random) -> Unit:
    radius = r.randint(2, 6)
    return unit(
        "inside_circle",
        f"""
def inside_circle(point, center=(0, 0), radius={radius}):
    dx = point[0] - center[0]
    dy = point[1] - center[1]
    return dx * dx + dy * dy <= radius * radius
""",
        f"whether a point lies in the circle of radius {radius}",
        "inside_circle((0, 0))", f"inside_circle(({radius}, 0))", f"inside_circle(({radius}, 1))",
        "inside_circle((1, 1), (5, 5))",
    )  # fmt: skip


def _perimeter(r: random.Random) -> Unit:
    return unit(
        "perimeter",
        """
def perimeter(points):
    total = 0
    for i in range(len(points)):
        a = points[i]
        b = points[(i + 1) % len(points)]
        total += abs(a[0] - b[0]) + abs(a[1] - b[1])
    return total
""",
        "the perimeter of an axis-aligned polygon",
        "perimeter([(0, 0), (4, 0), (4, 3), (0, 3)])", "perimeter([])", "perimeter([(0, 0), (2, 0), (2, 2), (0, 2)])",
    )  # fmt: skip


MODULES: dict[str, tuple[Draw, ...]] = {
    "points": (_manhattan, _centroid, _inside_circle),
    "shapes": (_rect_area, _perimeter),
}
"""module name -> the units it holds (drawn per package)."""
