#!/usr/bin/env python3
"""Fails when a public declaration in the given C++ headers has no comment.

    python3 docs/check_documented.py include/posbias/*.h

A declaration is public when it sits at namespace scope (outside a
namespace named `detail` or `internal`) or in the public part of a class or
struct. It is documented when a comment line (// or ///) comes right before
it, or a trailing comment (///< or //) sits on its first line, or it follows
a documented declaration with no blank line between (a group under one
comment, e.g. `/// Element type, number of dimensions, and extents.` over
dtype(), dim() and shape()). Not checked: enumerators, defaulted or deleted
special members, `friend`, `static_assert`, `using namespace`,
`TORCH_MODULE(X)` (documented by its XImpl class), preprocessor lines. Prints one line per undocumented declaration (FILE:LINE: text) and
exits 1 if there is one, 0 otherwise.
"""
import re
import sys


def strip_strings(line):
    return re.sub(r'"(\\.|[^"\\])*"', '""', line)


def code_and_comment(line):
    """The code part of a line and whether it carries a comment."""
    s = strip_strings(line)
    at = s.find("//")
    if at >= 0:
        return s[:at], True
    return s, False


def check(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    problems = []
    # Scope stack entries: [kind, public?]; kinds: namespace, hidden, class, enum, body.
    scopes = [["namespace", True]]
    in_block_comment = False
    stmt = None  # {"start": line index, "text": str, "documented": bool}
    prev_kind = "blank"  # what line k-1 was: blank, comment, code
    prev_documented_decl = False  # line k-1 ended a documented declaration
    body_depth = 0  # brace depth inside a skipped body
    paren = 0

    def public_scope():
        kind, public = scopes[-1]
        return kind in ("namespace", "class") and public and all(
            k != "hidden" for k, _ in scopes)

    for k, raw in enumerate(lines):
        line = raw.strip()
        if in_block_comment:
            if "*/" in line:
                in_block_comment = False
            prev_kind = "comment"
            continue
        if line.startswith("/*"):
            in_block_comment = "*/" not in line
            prev_kind = "comment"
            continue
        if not line:
            prev_kind = "blank"
            prev_documented_decl = False
            continue
        if line.startswith("//"):
            prev_kind = "comment"
            continue
        if line.startswith("#"):
            prev_kind = "blank"
            prev_documented_decl = False
            continue
        code, has_comment = code_and_comment(line)
        code = code.strip()

        if body_depth > 0:  # inside a function body or an enum
            body_depth += code.count("{") - code.count("}")
            if body_depth <= 0:
                body_depth = 0
                if scopes and scopes[-1][0] in ("body", "enum"):
                    scopes.pop()
            prev_kind = "code"
            continue

        if stmt is None:
            m = re.match(r"(public|private|protected)\s*:", code)
            if m and scopes[-1][0] == "class":
                scopes[-1][1] = m.group(1) == "public"
                prev_kind = "comment"  # a label does not break a group
                continue
            if code.startswith("}"):
                if len(scopes) > 1:
                    scopes.pop()
                prev_kind = "code"
                prev_documented_decl = False
                continue
            documented = has_comment or prev_kind == "comment" or (
                prev_kind == "code" and prev_documented_decl)
            stmt = {"start": k, "text": "", "documented": documented}
            paren = 0
        stmt["text"] += " " + code
        paren += code.count("(") - code.count(")")
        text = stmt["text"].strip()
        ended = False
        opens_scope = None
        if paren <= 0 and "{" in code:
            head = text[: text.find("{")]
            if re.match(r"(inline\s+)?namespace\b", head):
                name = head.split()[-1] if len(head.split()) > 1 else ""
                opens_scope = ["hidden" if name in ("detail", "internal") else "namespace", True]
            elif re.match(r"(template\s*<.*>\s*)?(class|struct)\b", head) and "(" not in head:
                opens_scope = ["class", head.lstrip().startswith("struct") or
                               re.match(r"template\s*<.*>\s*struct\b", head) is not None]
            elif re.match(r"enum\b", head):
                opens_scope = ["enum", True]
            else:
                opens_scope = ["body", True]
            ended = True
        elif paren <= 0 and code.endswith(";"):
            ended = True
        if not ended:
            prev_kind = "code"
            continue
        exempt = (re.match(r"(friend|static_assert|using\s+namespace|TORCH_MODULE\()", text) or
                  re.search(r"=\s*(default|delete)\s*;", text) or
                  (opens_scope is not None and opens_scope[0] in ("namespace", "hidden")) or
                  text.startswith("extern \"C\""))
        if public_scope() and not exempt and not stmt["documented"]:
            problems.append(f"{path}:{stmt['start'] + 1}: undocumented: {text[:100]}")
        prev_documented_decl = bool(stmt["documented"]) or bool(exempt)
        if opens_scope is not None:
            depth = code.count("{") - code.count("}")
            if opens_scope[0] in ("body", "enum"):
                if depth > 0:
                    scopes.append(opens_scope)
                    body_depth = depth
            elif depth > 0:
                scopes.append(opens_scope)
        stmt = None
        prev_kind = "code"
    return problems


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().split("\n")[2].strip(), file=sys.stderr)
        return 2
    problems = []
    for path in argv[1:]:
        problems += check(path)
    for p in problems:
        print(p)
    print(f"{len(problems)} undocumented public declaration(s) in {len(argv) - 1} header(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
