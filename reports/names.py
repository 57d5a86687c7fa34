"""Kernel and operator names as a person reads them.

Trace names are C++ signatures ('void at::native::vectorized_elementwise_kernel<4,
at::native::CUDAFunctor_add<float>, ...>(int, ...)'), often hundreds of characters long and
often identical up to a template argument. A report shows a short name in charts and tables
(``short_name``), makes two different kernels read differently again where shortening made
them equal (``display_names``), and fits names to a chart's label column; the full name always
stays in a title attribute and in the embedded data. Display only: nothing here changes a
number or which kernel a row is.
"""

from __future__ import annotations

import re

from gpudiag.reports import svg

_AUTOGRAD = "autograd::engine::evaluate_function: "
_ANON = "(anonymous namespace)::"
_GENERIC = {"Kernel", "Kernel2", "device_kernel", "kernel"}  # wrappers named by their template


def _strip_groups(text: str, keep_templates: bool) -> str | None:
    """``text`` without its top-level argument lists ``(...)`` and, unless ``keep_templates``,
    template arguments ``<...>``; None when the brackets do not pair up (not a C++ name). A
    parenthesis after a space is prose, not an argument list: 'Memset (Device)' keeps it."""
    out: list[str] = []
    stack: list[str] = []  # "<", "(", or "p" for a kept (prose) parenthesis
    opening = {">": "<", ")": "("}
    prev = ""
    for ch in text:
        shown = all(g == "p" for g in stack) or (keep_templates and stack[0] == "<")
        if ch == "(" and prev.isspace() and shown:
            stack.append("p")
            keep = True
        elif ch in "<(":
            stack.append(ch)
            keep = keep_templates and stack[0] == "<"
        elif ch in ">)":
            if not stack or (stack[-1] != opening[ch] and not (ch == ")" and stack[-1] == "p")):
                return None
            keep = stack[-1] == "p" and shown or (keep_templates and stack[0] == "<")
            stack.pop()
        else:
            keep = shown
        if keep:
            out.append(ch)
        prev = ch
    return None if stack else "".join(out)


def _template_args(text: str) -> list[str] | None:
    """The top-level arguments of the template argument list that ``text`` starts with."""
    if not text.startswith("<"):
        return None
    args: list[str] = []
    depth, cur = 0, ""
    for ch in text:
        if ch in "<(":
            depth += 1
            if depth == 1:
                continue
        elif ch in ">)":
            depth -= 1
            if depth == 0:
                args.append(cur.strip())
                return args
        elif ch == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return None


def _plain(name: str) -> tuple[str, str]:
    """(name without 'void ', anonymous namespaces and the autograd prefix, suffix to add)."""
    suffix = ""
    if name.startswith(_AUTOGRAD):
        name, suffix = name[len(_AUTOGRAD):], " (autograd)"
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    return name.replace(_ANON, ""), suffix


def short_name(name: str) -> str:
    """A kernel or operator name as a person reads it: 'void ns::fn<T, 4>(float*, int)' ->
    'ns::fn', 'autograd::engine::evaluate_function: AddmmBackward0' -> 'AddmmBackward0
    (autograd)'. Anything that is not a well-formed C++ name comes back unchanged. For
    display only: tables and tooltips keep the full name."""
    plain, suffix = _plain(name)
    stripped = _strip_groups(plain, keep_templates=False)
    if stripped is None or not stripped.strip():
        return name
    return " ".join(stripped.split()) + suffix


def _arg_name(arg: str, deep: bool = False) -> str:
    """A template argument cut to what names it: 'at::native::CUDAFunctor_add<float>' ->
    'CUDAFunctor_add', 'at::native::mse_kernel_cuda(at::TensorIteratorBase&)::{lambda()#1}'
    -> 'mse_kernel_cuda'; with ``deep`` its own first template argument is named too
    ('gpu_kernel_impl_nocast<direct_copy_kernel_cuda>'). Numbers and plain types stay."""
    arg = " ".join(arg.split())
    m = re.search(r"[<({]", arg)
    head = (arg[: m.start()] if m else arg).rstrip(": ").split("::")[-1] or arg
    if deep and m and m.group() == "<":
        inner = _template_args(arg[m.start():])
        if inner:
            return head + "<" + _arg_name(inner[0]) + (", \u2026" if len(inner) > 1 else "") + ">"
    return head


def _with_templates(name: str, positions: set[int] | None, deep: bool = False) -> str | None:
    """``short_name`` plus the template arguments at ``positions`` (all when None), '…' for
    the others: what tells apart kernels that share a function name."""
    plain, suffix = _plain(name)
    fn = _strip_groups(plain, keep_templates=False)
    kept = _strip_groups(plain, keep_templates=True)
    if not fn or kept is None or "<" not in kept:
        return None
    args = _template_args(kept[kept.index("<"):])
    if not args:
        return None
    shown, skipped = [], False
    for i, a in enumerate(args):
        if positions is None or i in positions:
            shown.append(_arg_name(a, deep))
            skipped = False
        elif not skipped:
            shown.append("\u2026")
            skipped = True
    return " ".join(fn.split()) + "<" + ", ".join(shown) + ">" + suffix


def display_names(names: list[str], px: float | None = None) -> list[str]:
    """``short_name`` of each, made distinct again where two different names shorten to the
    same text (the template arguments in which they differ are added), then fitted to ``px``
    wide when given (``_fit_name``), cut so that different names still read differently."""
    out = [short_name(n) for n in names]
    for i, n in enumerate(names):  # wrappers such as cutlass::Kernel<the_real_kernel>
        if out[i].split("::")[-1] in _GENERIC:
            out[i] = _with_templates(n, None) or out[i]
    for idx in _clashes(names, out):
        argsets = []
        for i in idx:
            kept = _strip_groups(_plain(names[i])[0], keep_templates=True)
            argsets.append(_template_args(kept[kept.index("<"):]) if kept and "<" in kept else None)
        positions: set[int] | None = None
        if all(a is not None for a in argsets) and len({len(a or []) for a in argsets}) == 1:
            positions = {k for k in range(len(argsets[0] or []))
                         if len({(a or [])[k] for a in argsets}) > 1} or None
        for deep in (False, True):
            trial = {i: _with_templates(names[i], positions, deep) or out[i] for i in idx}
            if len(set(trial.values())) == len({names[i] for i in idx}):
                break
        else:  # overloads, or names that differ only deep inside: the full name
            trial = {i: "".join(_plain(names[i])) for i in idx}
        for i, t in trial.items():
            out[i] = t
    if px is None:
        return out
    fitted = [_fit_name(d, px) for d in out]
    for idx in _clashes(names, fitted):  # cut elsewhere until they differ
        for head in (0.25, 0.1, 0.0, 0.6, 0.8):
            trial = {i: _fit_name(out[i], px, head) for i in idx}
            if len(set(trial.values())) == len(idx):
                for i, t in trial.items():
                    fitted[i] = t
                break
    return fitted


def _clashes(names: list[str], shown: list[str]) -> list[list[int]]:
    """Groups of indices whose different names are shown as the same text."""
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(shown):
        groups.setdefault(d, []).append(i)
    return [idx for idx in groups.values() if len({names[i] for i in idx}) > 1]


def _fit_name(d: str, px: float, head: float = 0.42) -> str:
    """``d`` cut to ``px`` wide: first without its namespaces, then in the middle, keeping a
    trailing '<…>' (the part that tells kernels apart) whole when it takes under half."""
    if svg.text_width(d) <= px:
        return d
    cut = d.find("<") if d.endswith(">") else -1
    fn, tail = (d[:cut], d[cut:]) if cut > 0 else (d, "")
    if fn.endswith(" (autograd)"):
        fn, tail = fn[: -len(" (autograd)")], " (autograd)" + tail
    bare = fn.split("::")[-1]
    if svg.text_width(bare + tail) <= px:
        return bare + tail
    if tail and svg.text_width(tail) < 0.6 * px:
        return svg.fit(bare, px - svg.text_width(tail), head=head) + tail
    return svg.fit(bare + tail, px, head=head)
