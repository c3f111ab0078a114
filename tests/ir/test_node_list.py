"""Graph.nodes: the linked node sequence, mutation while iterating, order queries, toposort."""

from __future__ import annotations

import time

import numpy as np
import pytest

from glowpy.errors import InternalError, InvalidModel
from glowpy.ir import Graph, TensorType
from glowpy.ir.graph import _KEY_GAP, Node, NodeList

F32 = np.float32


def chain(n: int) -> Graph:
    """x -> relu0 -> relu1 -> ... -> relu{n-1}, the last one the output."""
    g = Graph("chain")
    v = g.add_input("x", TensorType(F32, (4,)))
    for i in range(n):
        v = g.add_node("Relu", [v], name=f"r{i}").outputs[0]
    g.outputs = [v]
    return g


def names(g: Graph) -> list[str]:
    return [n.name for n in g.nodes]


def test_sequence_protocol() -> None:
    g = chain(5)
    nodes = list(g.nodes)
    assert len(g.nodes) == 5 and bool(g.nodes) and not NodeList()
    assert names(g) == ["r0", "r1", "r2", "r3", "r4"]
    assert [n.name for n in reversed(g.nodes)] == ["r4", "r3", "r2", "r1", "r0"]
    assert g.nodes[0] is nodes[0] and g.nodes[-1] is nodes[4] and g.nodes[2] is nodes[2] and g.nodes[-2] is nodes[3]
    assert g.nodes[1:3] == nodes[1:3]
    assert g.nodes.first is nodes[0] and g.nodes.last is nodes[4]
    assert g.nodes.after(nodes[1]) is nodes[2] and g.nodes.after(nodes[4]) is None
    assert g.nodes.before(nodes[1]) is nodes[0] and g.nodes.before(nodes[0]) is None
    assert [g.nodes.index(n) for n in nodes] == [0, 1, 2, 3, 4]
    assert all(n in g.nodes for n in nodes) and "r0" not in g.nodes
    with pytest.raises(IndexError, match="node index 5 out of range for 5 nodes"):
        g.nodes[5]
    with pytest.raises(IndexError, match="out of range"):
        g.nodes[-6]


def test_add_node_before_after_and_at_index() -> None:
    g = chain(3)
    r0, r1, r2 = g.nodes
    x = g.inputs[0]
    a = g.add_node("Abs", [x], name="a", before=r0)
    b = g.add_node("Neg", [x], name="b", after=r1)
    c = g.add_node("Exp", [x], name="c", index=2)
    d = g.add_node("Log", [x], name="d", after=r2)
    assert names(g) == ["a", "r0", "c", "r1", "b", "r2", "d"]
    assert g.nodes.last is d and g.nodes.first is a
    assert g.nodes.comes_before(a, r0) and g.nodes.comes_before(c, b) and not g.nodes.comes_before(d, b)
    for n in (a, b, c, d):
        g.outputs.append(n.outputs[0])
    g.verify()


def test_add_node_rejects_two_places_and_foreign_anchors() -> None:
    g = chain(2)
    r0, r1 = g.nodes
    with pytest.raises(InternalError, match="at most one of before, after and index"):
        g.add_node("Relu", [g.inputs[0]], before=r0, after=r1)
    other = chain(1)
    with pytest.raises(InternalError, match=r"node 'r0' \(Relu\): add_node anchor is not in this graph"):
        g.add_node("Relu", [g.inputs[0]], before=other.nodes[0])
    g.remove_node(g.add_node("Relu", [g.inputs[0]], name="gone"))
    assert len(g.nodes) == 2  # the refused adds left nothing behind


def test_removed_node_is_no_member() -> None:
    g = chain(3)
    r0, r1, r2 = g.nodes
    g.replace_all_uses(r1.outputs[0], r0.outputs[0])
    g.remove_node(r1)
    assert r1 not in g.nodes and len(g.nodes) == 2 and names(g) == ["r0", "r2"]
    with pytest.raises(InternalError, match=r"node 'r1' \(Relu\): node is not in this graph"):
        g.nodes.comes_before(r1, r2)
    with pytest.raises(InternalError, match="node is already in a graph"):
        g.nodes.append(r0)
    g.verify()


def test_iteration_survives_removing_the_current_node() -> None:
    g = chain(6)
    seen = []
    for node in g.nodes:
        seen.append(node.name)
        if node.name in ("r1", "r2", "r4"):
            g.replace_all_uses(node.outputs[0], node.inputs[0])
            g.remove_node(node)
    assert seen == ["r0", "r1", "r2", "r3", "r4", "r5"]
    assert names(g) == ["r0", "r3", "r5"]
    g.verify()


def test_iteration_visits_nodes_inserted_after_the_current_one_only() -> None:
    g = chain(3)
    seen = []
    for node in g.nodes:
        seen.append(node.name)
        if node.name == "r1":
            g.add_node("Abs", [node.outputs[0]], name="after_r1", after=node)
            g.add_node("Neg", [node.inputs[0]], name="before_r1", before=node)
            g.add_node("Exp", [node.inputs[0]], name="at_end")
    assert seen == ["r0", "r1", "after_r1", "r2", "at_end"]
    assert names(g) == ["r0", "before_r1", "r1", "after_r1", "r2", "at_end"]


def test_iteration_survives_replacing_the_current_node() -> None:
    """What a pass does: insert the replacement before the current node, remove the current one,
    and carry on with the node after it (the replacement, standing before, is not revisited)."""
    g = chain(4)
    seen = []
    for node in g.nodes:
        seen.append(node.name)
        if node.op == "Relu" and node.name in ("r1", "r2"):
            new = g.add_node("Abs", list(node.inputs), name=f"abs_{node.name}", before=node)
            g.replace_all_uses(node.outputs[0], new.outputs[0])
            g.remove_node(node)
    assert seen == ["r0", "r1", "r2", "r3"]
    assert names(g) == ["r0", "abs_r1", "abs_r2", "r3"]
    g.verify()


def test_reverse_iteration_survives_removal() -> None:
    """eliminate_dead_code's walk: from the end, removing dead nodes as it goes."""
    g = chain(5)
    g.outputs = [g.nodes[1].outputs[0]]
    for node in reversed(g.nodes):
        if not node.outputs[0].users and node.outputs[0] not in g.outputs:
            g.remove_node(node)
    assert names(g) == ["r0", "r1"]
    g.verify()


def test_order_keys_stay_right_when_one_spot_takes_many_inserts() -> None:
    """Inserting again and again just before one node halves the key gap each time: past about 40
    inserts the keys run out, and the list is renumbered (once) at the next order query."""
    g = chain(2)
    r0, r1 = g.nodes
    added = []
    for i in range(200):
        added.append(g.add_node("Abs", [g.inputs[0]], name=f"a{i}", before=r1))
        if i % 50 == 0:
            assert g.nodes.comes_before(r0, added[-1]) and g.nodes.comes_before(added[-1], r1)
    assert g.nodes._stale  # 200 halvings of a 2**40 gap cannot all fit
    keys = [g.nodes.key(n) for n in g.nodes]
    assert keys == sorted(set(keys)) and not g.nodes._stale
    assert keys[:3] == [0, _KEY_GAP, 2 * _KEY_GAP]
    order = [r0, *added, r1]
    assert list(g.nodes) == order
    assert all(g.nodes.comes_before(a, b) for a, b in zip(order, order[1:]))
    assert not g.nodes.comes_before(r1, r0) and not g.nodes.comes_before(r0, r0)


def test_inserting_before_the_first_node_keeps_keys_increasing() -> None:
    g = chain(1)
    (r0,) = g.nodes
    firsts = [r0]
    for i in range(60):
        firsts.insert(0, g.add_node("Abs", [g.inputs[0]], name=f"a{i}", before=firsts[0]))
    assert list(g.nodes) == firsts
    assert all(g.nodes.comes_before(a, b) for a, b in zip(firsts, firsts[1:]))


def test_mutation_and_order_queries_are_constant_time() -> None:
    """Inserting, comparing and removing near the start of a list of 200,000 nodes costs about what
    it costs in a list of 10 (a Python list would shift every node after the spot, and find a
    node's position by searching from the front)."""

    def bare(i: int) -> Node:
        return Node("Relu", f"n{i}", [], [], {})

    def churn(nl: NodeList) -> float:
        anchor, last = nl[1], nl.last
        t = time.perf_counter()
        for i in range(2000):
            n = bare(i)
            nl.insert_before(anchor, n)
            if not (nl.comes_before(n, last) and nl.comes_before(nl.first, n)):
                raise AssertionError("order query is wrong")
            nl.remove(n)
        return time.perf_counter() - t

    small, large = NodeList(bare(i) for i in range(10)), NodeList(bare(i) for i in range(200_000))
    t_small = min(churn(small) for _ in range(3))
    t_large = min(churn(large) for _ in range(3))
    assert len(large) == 200_000
    assert t_large < 3 * t_small + 0.05, (t_small, t_large)


def test_toposort_is_stable_and_restores_order() -> None:
    g = Graph()
    x = g.add_input("x", TensorType(F32, (4,)))
    a = g.add_node("Relu", [x], name="a")
    b = g.add_node("Abs", [x], name="b")
    c = g.add_node("Add", [a.outputs[0], b.outputs[0]], name="c")
    d = g.add_node("Neg", [x], name="d")
    g.outputs = [c.outputs[0], d.outputs[0]]
    g.toposort()
    assert names(g) == ["a", "b", "c", "d"]  # already valid: left as it is
    g.nodes.reorder([c, d, b, a])
    with pytest.raises(InvalidModel, match="used before the node that produces it"):
        g.verify()
    g.toposort()
    # c must follow a and b; d and b keep their relative order, and each node goes as early as
    # its inputs allow, taking the one that stood first among the ready ones
    assert names(g) == ["d", "b", "a", "c"]
    g.verify()
    assert [g.nodes.key(n) for n in g.nodes] == sorted(g.nodes.key(n) for n in g.nodes)


def test_toposort_of_a_long_graph_needs_no_recursion() -> None:
    g = chain(5000)
    g.nodes.reorder(list(g.nodes)[::-1])
    g.toposort()
    assert names(g) == [f"r{i}" for i in range(5000)]
    g.verify()


def test_reorder_refuses_a_different_node_set() -> None:
    g = chain(3)
    nodes = list(g.nodes)
    with pytest.raises(InternalError, match="reorder needs each node of the list exactly once"):
        g.nodes.reorder(nodes[:2])
    with pytest.raises(InternalError, match="exactly once"):
        g.nodes.reorder([nodes[0], nodes[0], nodes[1]])
    with pytest.raises(InternalError, match="exactly once"):
        g.nodes.reorder([*nodes[:2], chain(1).nodes[0]])
    assert list(g.nodes) == nodes


def cyclic_graph() -> Graph:
    """x -> a -> b -> c -> d, then a's input rewired to c: a -> b -> c -> a is a cycle, d hangs off it."""
    g = Graph("cyc")
    x = g.add_input("x", TensorType(F32, (4,)))
    a = g.add_node("Relu", [x], name="a")
    b = g.add_node("Abs", [a.outputs[0]], name="b")
    c = g.add_node("Neg", [b.outputs[0]], name="c")
    d = g.add_node("Exp", [c.outputs[0]], name="d")
    g.outputs = [d.outputs[0]]
    a.set_input(0, c.outputs[0])
    return g


def test_toposort_names_the_cycle() -> None:
    g = cyclic_graph()
    with pytest.raises(InvalidModel) as e:
        g.toposort()
    assert e.value.reason == "the graph has a cycle" and e.value.expected == "acyclic graph"
    # in dataflow order, from the node the walk met again, back to it
    assert e.value.found in ("a -> b -> c -> a", "b -> c -> a -> b", "c -> a -> b -> c")
    assert e.value.node == e.value.found.split(" -> ")[0]
    assert names(g) == ["a", "b", "c", "d"]  # a failed toposort leaves the order as it was


def test_verify_names_the_cycle() -> None:
    with pytest.raises(InvalidModel, match=r"the graph has a cycle.*(a -> b -> c -> a|b -> c -> a -> b|c -> a -> b -> c)"):
        cyclic_graph().verify()


def test_self_loop_is_a_cycle() -> None:
    g = chain(2)
    r0, r1 = g.nodes
    r1.set_input(0, r1.outputs[0])
    with pytest.raises(InvalidModel, match=r"node 'r1'.*the graph has a cycle.*found r1 -> r1"):
        g.toposort()


def test_verify_catches_a_broken_node_list() -> None:
    g = chain(3)
    g.nodes._len = 4  # as a buggy edit of the list would leave it
    with pytest.raises(InternalError, match="node list length is stale"):
        g.verify()
    g = chain(3)
    r0, r1, r2 = g.nodes
    r1._key = r0._key  # keys must increase along the list
    with pytest.raises(InternalError, match=r"node 'r1' \(Relu\): node list keys are out of order"):
        g.verify()


def test_replace_all_uses_moves_every_use() -> None:
    g = Graph()
    x = g.add_input("x", TensorType(F32, (4,)))
    y = g.add_input("y", TensorType(F32, (4,)))
    users = [g.add_node("Add", [x, x], name=f"u{i}") for i in range(3000)]
    g.outputs = [u.outputs[0] for u in users]
    g.replace_all_uses(x, y)
    assert x.users == [] and len(y.users) == 6000 and all(u.inputs == [y, y] for u in users)
    g.verify()


def test_removing_many_users_in_either_order_keeps_use_lists_right() -> None:
    g = Graph()
    x = g.add_input("x", TensorType(F32, (4,)))
    users = [g.add_node("Add", [x, x], name=f"u{i}") for i in range(1000)]
    for u in users[:500]:
        g.remove_node(u)  # oldest first (what a forward rewrite does)
    for u in reversed(users[500:]):
        g.remove_node(u)  # newest first (what eliminate_dead_code does)
    assert x.users == [] and len(g.nodes) == 0
    keep = [g.add_node("Add", [x, x], name=f"k{i}") for i in range(3)]
    keep[1].set_input(1, keep[0].outputs[0])
    assert x.users == [keep[0], keep[0], keep[1], keep[2], keep[2]]
    g.outputs = [keep[1].outputs[0], keep[2].outputs[0]]
    g.verify()
