"""The one way settings enter every nanoswap script (train.py, sample.py, ...).

Scripts keep settings as plain module globals and let the command line replace them:

    batch_size = 12
    from configurator import configure, settings_of
    globals().update(configure(settings_of(globals()), sys.argv[1:], prog='train.py', doc=__doc__))

argv is processed left to right, later elements win:
  config/foo.py   Python assignments (`n_layer = 6`) that may read the current settings
  --key=value     value read with ast.literal_eval, falling back to the raw text
  --help / -h     list every setting with its default and the comment beside it, exit 0
Values must fit the type of their default; a setting whose default is None takes None or the type its
annotation names (`compile: Optional[bool] = None`, read from the script's source, and GPTConfig's field
annotations for model flags; without one, any literal). Any user mistake prints one `error: ...` line to
stderr and exits with code 2.

Scripts that build a model take every field of GPTConfig as a setting: model_flags() reads them from
the sources of model.py and of each chapter (chapters/), so settings are checked (and --help answers) before
torch is imported.
"""
import ast
import difflib
import functools
import io
import os
import re
import sys
import tokenize
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_PY = os.path.join(HERE, 'model.py')
CHAPTERS_DIR = os.path.join(HERE, 'chapters')

SETTING_TYPES = (bool, int, float, str, type(None))
# Renamed flags, old name -> (new name, {old value: new value}): an old command line or config file is told what
# replaced them, and old checkpoints load (upgrade_args).
RENAMED_FLAGS = {'prenorm': ('norm_position', {True: 'pre', False: 'post'})}
_TYPE_NAMES = {'bool': bool, 'int': int, 'float': float, 'str': str}


class ConfigError(ValueError):
    """A user mistake in argv or a config file; configure() reports it as one line."""


class Settings(dict):
    """The settings, and in .given the names argv set (an override, or a config file changing the value)."""
    given = frozenset()


def settings_of(namespace: dict) -> dict:
    """The settings in a script's globals(): public names holding bool/int/float/str/None."""
    return {k: v for k, v in namespace.items()
            if not k.startswith('_') and isinstance(v, SETTING_TYPES)}


def _type_name(default, kind=None):
    # a None default marks an optional value (n_kv_head: None means "same as n_head"; rope_scaling: off)
    if default is None:
        return f'{kind.__name__} or None' if kind else 'any literal'
    return type(default).__name__


def _annotated_type(node):
    """The type an annotation names: `int`, `Optional[int]` or `int | None` give int; anything else None."""
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ('Optional', 'typing.Optional'):
        return _annotated_type(node.slice)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [n for n in (node.left, node.right) if not (isinstance(n, ast.Constant) and n.value is None)]
        return _annotated_type(sides[0]) if len(sides) == 1 else None
    return _TYPE_NAMES.get(node.id) if isinstance(node, ast.Name) else None


def _assignments(path, class_name=None):
    """[(name, value node, comment, type)] of the top-level assignments in a Python file, or of the class
    body of class_name; comment: the text of a `# ...` on the assignment's last line, else ''; type: what
    an annotation names (`compile: Optional[bool] = None` gives bool), else None. Each file is read once per
    version: every setting checked asks model.py's tables, and every script reads 20 sources at its start."""
    stat = os.stat(path)
    return _parsed_assignments(os.path.abspath(path), class_name, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _parsed_module(path, mtime_ns, size):
    """(the module's top-level statements, its lines), for every class and constant read from it."""
    with open(path, encoding='utf-8') as f:
        source = f.read()
    return ast.parse(source).body, source.splitlines()


def _line_comment(line):
    """The text of a `# ...` comment on one line of source, else '': tokenizing the line alone, not the whole
    file (a tenth of the time; a line that closes a bracket opened above still yields its comment first)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                return tok.string.lstrip('#').strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return ''


@functools.lru_cache(maxsize=64)
def _parsed_assignments(path, class_name, mtime_ns, size):
    body, lines = _parsed_module(path, mtime_ns, size)
    if class_name is not None:  # a dataclass's fields: its annotated assignments
        body = [node for node in next(node.body for node in body if isinstance(node, ast.ClassDef)
                                      and node.name == class_name) if isinstance(node, ast.AnnAssign)]
    out = []
    for node in body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            getattr(node, 'target', None) if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and node.value is not None:
            kind = _annotated_type(node.annotation) if isinstance(node, ast.AnnAssign) else None
            comment = _line_comment(lines[node.end_lineno - 1]) if '#' in lines[node.end_lineno - 1] else ''
            out.append((target.id, node.value, comment, kind))
    return tuple(out)  # shared by every caller: not to be changed


@functools.lru_cache(maxsize=1)
def model_sources():
    """[(file, its config class)]: model.py's GPTConfig, then each chapter's Config in the order of
    chapters/__init__.py's CHAPTERS (the fields of chapters.GPTConfig)."""
    init = os.path.join(CHAPTERS_DIR, '__init__.py')
    with open(init, encoding='utf-8') as f:
        tree = ast.parse(f.read())
    names = next(node.value.elts for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], 'id', None) == 'CHAPTERS')
    return ((MODEL_PY, 'GPTConfig'),) + tuple((os.path.join(CHAPTERS_DIR, f'{n.id}.py'), 'Config') for n in names)


def _module_constant(path, name, default):
    return next((ast.literal_eval(value) for key, value, _, _ in _assignments(path) if key == name), default)


def model_flags(runtime_only=False):
    """GPTConfig's fields, {name: default}, read from the sources of model.py and the chapters: the model flags
    every script that builds a model takes as settings (defaults must be literals there); runtime_only: only
    those of the RUNTIME_FLAGS there, which change no weight (what a script using a trained model may set)."""
    flags, runtime = {}, ()
    for path, class_name in model_sources():
        flags.update((name, ast.literal_eval(value)) for name, value, _, _ in _assignments(path, class_name))
        runtime += _module_constant(path, 'RUNTIME_FLAGS', ())
    return {k: v for k, v in flags.items() if k in runtime} if runtime_only else flags


def upgrade_args(args):
    """A saved config's flags under today's names (checkpoints from before norm_position said prenorm), and
    with today's defaults where the meaning changed: a GELU MLP saved before the gelu field computed the tanh form;
    a flag saved at a chapter's OLD_DEFAULTS value (a speed setting whose default changed) takes today's."""
    args = dict(args)
    if 'gelu' not in args and args.get('mlp', 'gelu') == 'gelu':
        args['gelu'] = 'tanh'
    for old, (new, values) in RENAMED_FLAGS.items():
        if old in args:
            value = args.pop(old)
            args.setdefault(new, values.get(value, value))
    for path, _ in model_sources():  # a chapter's OLD_DEFAULTS: a default changed where no output does
        for flag, value in _module_constant(path, 'OLD_DEFAULTS', {}).items():
            if args.get(flag) == value:
                del args[flag]
    return args


def script_defaults(path):
    """The settings a flat script starts from, read without running it: its top-level assignments of
    constant expressions (`gradient_accumulation_steps = 5 * 8`), and the model flags at the place it
    takes them (`globals().update(model_flags())`)."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read())
    defaults = {}
    for node in tree.body:
        if 'configure(' in ast.unparse(node):  # what comes after the settings are read is not a setting
            break
        if isinstance(node, ast.Expr) and 'model_flags(' in ast.unparse(node):
            defaults.update(model_flags())
        else:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AnnAssign) and node.value is not None else None
            if not isinstance(target, ast.Name):
                continue
            try:
                value = eval(compile(ast.Expression(node.value), path, 'eval'), {'__builtins__': {}})
            except Exception:  # an expression of other names: not a setting
                continue
            if not target.id.startswith('_') and isinstance(value, SETTING_TYPES):
                defaults[target.id] = value
    return defaults


def _read_settings(prog):
    """({setting: its comment}, {setting: its annotated type}) from GPTConfig's fields and the script's own
    globals (the script's win)."""
    descriptions, kinds = {}, {}
    for path, class_name in model_sources() + ((os.path.join(HERE, prog or ''), None),):
        try:
            for name, _, comment, kind in _assignments(path, class_name):
                if comment:
                    descriptions[name] = comment
                if kind:
                    kinds[name] = kind
        except (OSError, SyntaxError, StopIteration, UnicodeDecodeError):
            pass  # help and checks without what the source says beat none
    return descriptions, kinds


def _descriptions(prog):
    """{setting: its comment} from the script's own globals and GPTConfig's fields."""
    return _read_settings(prog)[0]


def _renamed(key, value, on_command_line):
    """What replaced a renamed setting, written as the user would write it there (--new=value, or new = 'value')."""
    new_key, values = RENAMED_FLAGS[key]
    if isinstance(value, str) and value.lower() in ('true', 'false'):
        value = value.lower() == 'true'
    new_value = values.get(value) if isinstance(value, (bool, int, float, str)) else None
    if new_value is None:
        return (f"setting '{key}' was renamed to '{new_key}' (its values: "
                f"{', '.join(f'{k!r} -> {v!r}' for k, v in values.items())})")
    written = f"--{new_key}={new_value}" if on_command_line else f"{new_key} = {new_value!r}"
    return f"setting '{key}' was renamed: {key}={value!r} is now {written}"


def _model_flag_refusal(key, defaults):
    """Why a script that takes only some model flags, or none, refuses this one: it shapes the weights, so a
    trained model's checkpoint fixes it (a new model takes it in train.py)."""
    runtime = [k for k in model_flags(runtime_only=True) if k in defaults]
    return (f"'{key}' is a model flag that a trained model fixes (its checkpoint's value is used; train.py sets it for "
            f"a new model)" + (f": only the flags that change no weight may differ here, e.g. {', '.join(runtime[:3])} "
                               f"(--help lists them)" if runtime else ''))


def _check(defaults, key, value, raw=None, kinds=None):
    """Return `value` as the type of defaults[key] (for a None default: None, or the type kinds[key] names,
    else any literal), or raise ConfigError."""
    if key in RENAMED_FLAGS and key not in defaults and RENAMED_FLAGS[key][0] in defaults:
        raise ConfigError(_renamed(key, value, on_command_line=raw is not None))
    if key not in defaults and key in model_flags():
        raise ConfigError(_model_flag_refusal(key, defaults))
    if key not in defaults:
        close = difflib.get_close_matches(key, list(defaults), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ''
        raise ConfigError(f"unknown setting '{key}'{hint}")
    default = defaults[key]
    kind = type(default) if default is not None else (kinds or {}).get(key)
    if default is None and value is None:
        return None
    # bool is a subclass of int, so it must be tested first and excluded from int/float
    if kind is bool:
        if isinstance(value, (bool, str)) and str(value).lower() in ('true', 'false'):
            return str(value).lower() == 'true'
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):  # includes a quoted literal like "'hello'"
            return value
        if raw is not None:  # CLI text stays text: --start=123 gives '123', not 123
            return raw
    elif isinstance(value, str) and value.lower() in ('true', 'false'):  # an unannotated None default
        return value.lower() == 'true'
    elif isinstance(value, SETTING_TYPES):  # a None default without an annotation: any literal
        return value
    raise ConfigError(f"setting '{key}' expects {_type_name(default, kind)}, "
                      f"got {value!r} ({type(value).__name__})")


def _apply_override(arg, defaults, settings, kinds=None):
    key, sep, raw = arg[2:].partition('=')  # first '=' only: --start=a=b gives 'a=b'
    if not arg.startswith('--') or not sep or not key:
        raise ConfigError(f"malformed argument '{arg}': expected --key=value")
    try:
        value = ast.literal_eval(raw)
    except Exception:  # anything that is not a Python literal is just text
        value = raw
    settings[key] = _check(defaults, key, value, raw, kinds)
    return {key}


def _apply_file(path, defaults, settings, kinds=None):
    try:
        with open(path) as f:
            source = f.read()
    except OSError as e:  # missing, a directory, unreadable, ...
        problem = ' not found' if isinstance(e, FileNotFoundError) else f': {e.strerror}'
        raise ConfigError(f"config file '{path}'{problem}") from None
    namespace, changed = dict(settings), set()  # a copy, so the file can read earlier values safely
    try:
        exec(compile(source, path, 'exec'), namespace)
    except SyntaxError as e:
        raise ConfigError(f"config file '{path}' line {e.lineno}: {e.msg}") from None
    except Exception as e:
        # report the deepest line of the config file itself, not of whatever it called
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
        where = f' line {lines[-1]}' if lines else ''
        raise ConfigError(f"config file '{path}'{where}: {type(e).__name__}: {e}") from None
    for key, value in namespace.items():
        # imports and helper functions/classes are tools of the file, not settings
        if key.startswith('_') or isinstance(value, types.ModuleType) or callable(value):
            continue
        try:
            value = _check(defaults, key, value, kinds=kinds)
        except ConfigError as e:
            raise ConfigError(f"config file '{path}': {e}") from None
        if value != settings[key] or type(value) is not type(settings[key]):
            changed.add(key)
        settings[key] = value
    return changed


def _shown(value):
    # strings appear as typed on the CLI, unless blank or invisible (e.g. a newline)
    plain = not isinstance(value, str) or (value.isprintable() and value.strip() == value != '')
    return value if plain else repr(value)


def _print_help(defaults, prog, doc, from_model=()):
    print(f"usage: python {prog or sys.argv[0]} [config_file.py ...] [--key=value ...]")
    if doc:
        print('\n' + doc.strip() + '\n')
    descriptions, kinds = _read_settings(prog)
    items = []
    for k, v in defaults.items():
        kind = f'({_type_name(v, kinds.get(k))})'
        if k in from_model:  # the value in defaults is GPTConfig's, not the one that applies
            items.append((f'--{k}', kind, "default: the model's (checkpoint's) value; " + descriptions.get(k, '')))
        else:
            items.append((f'--{k}={_shown(v)}', kind, descriptions.get(k, '')))
    width = max((len(a) for a, _, _ in items), default=0)
    type_width = max((len(t) for _, t, _ in items), default=0)
    for arg, type_name, description in items:
        print(f'  {arg:<{width}}  {type_name:<{type_width}}  {description}'.rstrip())


HUB_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl', 'distilgpt2')  # hub ids without an org


def init_from_problem(init_from, modes=('scratch', 'resume')):
    """Why init_from cannot be loaded, said before torch loads (None when it may be): neither one of modes,
    a local directory, nor a plausible Hugging Face id (org/name or one of HUB_NAMES; a typo of a mode gets a
    suggestion), or, offline (HF_HUB_OFFLINE), a hub id not in the local cache."""
    if init_from in modes or os.path.isdir(init_from):
        return None
    if not (init_from in HUB_NAMES or re.fullmatch(r'[A-Za-z0-9][\w.-]*/[\w.-]+', init_from)):
        close = difflib.get_close_matches(init_from, list(modes) + list(HUB_NAMES), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ''
        return (f"init_from {init_from!r} is neither {', '.join(map(repr, modes))}, a local directory, nor a Hugging "
                f"Face id (org/name, or {', '.join(HUB_NAMES)}){hint}")
    if os.environ.get('HF_HUB_OFFLINE', '').upper() in ('1', 'ON', 'YES', 'TRUE'):
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None  # loading it will say transformers is missing
        if not isinstance(try_to_load_from_cache(init_from, 'config.json'), str):
            return (f"init_from {init_from!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: download "
                    f"it once online, or give a local directory")
    return None


def configure(defaults: dict, argv: list, prog: str = None, doc: str = None, from_model=()) -> Settings:
    """Return a new dict of `defaults` updated by the config files and overrides in argv (a Settings: its
    .given names what argv set). from_model: the settings whose value, unless given, is the loaded model's
    own (a trained model's runtime flags in sample.py): --help says so instead of showing GPTConfig's."""
    if '--help' in argv or '-h' in argv:
        try:
            _print_help(defaults, prog, doc, from_model)
        except BrokenPipeError:  # `--help | head` closed the pipe: nothing left to tell
            sys.stderr.close()
        sys.exit(0)
    settings, given = Settings(defaults), set()
    kinds = _read_settings(prog)[1] if prog else {}
    try:
        for arg in argv:
            given |= (_apply_override if arg.startswith('-') else _apply_file)(arg, defaults, settings, kinds)
    except ConfigError as e:
        # one line, no traceback: the user made a typo, not the program
        print('error: ' + ' '.join(str(e).splitlines()), file=sys.stderr)
        sys.exit(2)
    settings.given = frozenset(given)
    return settings
