import configparser
import re


def conv_scalar(v):
    v = v.strip()
    if v == "":
        return None
    if len(v) >= 2 and v[0] == v[-1] == '"':
        return v[1:-1]
    low = v.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if re.fullmatch(r"[+-]?\d+", v):
        return int(v)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+)([eE][+-]?\d+)?|[+-]?\d+[eE][+-]?\d+", v):
        return float(v)
    return v


def conv(v):
    s = v.strip()
    if not (len(s) >= 2 and s[0] == s[-1] == '"') and "," in s:
        return [conv_scalar(x) for x in s.split(",")]
    return conv_scalar(s)


def convert(text):
    cp = configparser.ConfigParser(interpolation=None)
    cp.read_string(text)
    out = {}
    for sec in cp.sections():
        node = out
        for part in sec.split("."):
            node = node.setdefault(part, {})
        for k, v in cp.items(sec):
            node[k] = conv(v)
    return out
