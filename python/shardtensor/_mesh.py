"""DeviceMesh and init_device_mesh, under DTensor's names.

A mesh is built over torch.distributed's process groups: a program that already called
torch.distributed.init_process_group (the usual torchrun script) keeps its one rendezvous, and
one that did not gets it initialised here from the launcher's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), as DTensor's init_device_mesh does. The C++ mesh then runs every
collective of shardtensor on those groups' backends, and get_group() hands back the same
ProcessGroup objects that torch.distributed uses.
"""

from __future__ import annotations

import datetime
import os
import sys
import weakref

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh as _TorchDeviceMesh

from . import _C

_DEFAULT_TIMEOUT_S = 300.0
_initialised_here = False  # whether shardtensor, not the program, called init_process_group


def collective_timeout_s() -> float:
    """$SHARDTENSOR_TIMEOUT_S, else 300 s: how long any collective may wait before it raises."""
    value = os.environ.get("SHARDTENSOR_TIMEOUT_S")
    if not value:
        return _DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"SHARDTENSOR_TIMEOUT_S={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ValueError(f"SHARDTENSOR_TIMEOUT_S={value!r} must be positive")
    return seconds


def _ensure_process_group(device_type: str) -> None:
    """Initialises torch.distributed from the launcher's environment unless the program did."""
    global _initialised_here
    if not dist.is_initialized():
        _initialised_here = True
        backend = {"cpu": "gloo", "cuda": "cpu:gloo,cuda:nccl"}.get(device_type)
        if backend is None:
            raise ValueError(f"init_device_mesh: device_type {device_type!r} is not supported; use 'cpu' or 'cuda'")
        timeout = datetime.timedelta(seconds=collective_timeout_s())
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, timeout=timeout)
        else:  # a single process, no launcher: a world of one over an in-process store
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    # The C++ layer reads the world from the environment; a program that passed rank and world
    # size to init_process_group directly has not set it.
    rank, size = dist.get_rank(), dist.get_world_size()
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(size))
    if (_C.world_rank(), _C.world_size()) != (rank, size):
        raise RuntimeError(f"torch.distributed says rank {rank} of {size}, but RANK/WORLD_SIZE in the environment "
                           f"say {_C.world_rank()} of {_C.world_size()}; launch with torchrun or shardrun, or make "
                           f"them agree")


# The meshes compiled graphs name, by position (DeviceMesh.__fx_repr__).
_IN_GRAPHS: list = []


class DeviceMesh(_TorchDeviceMesh):
    """An n-d array of ranks with one process group per slice along each mesh dim.

    ``DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))`` lays the given global
    ranks out as DTensor's DeviceMesh does. The mesh may leave ranks of the world out
    (``DeviceMesh("cpu", [1, 2])``): every rank still builds it, in the same order as the others,
    and on the ranks outside it ``get_coordinate()`` is None, tensors on it hold empty local
    pieces, ops on them keep global shapes and placements without computing or communicating,
    and what needs values (``item()``) raises. ``init_device_mesh`` builds the usual mesh over
    the whole world.

    It is a torch ``DeviceMesh`` too, so torch's own APIs take it as PhysicsNeMo's code passes
    it (``fully_shard(model, mesh=mesh["dp"])``, torch's ``distribute_tensor``): the public
    methods are ours, and the internals torch's code reads come from torch's mesh over the same
    process groups (``to_torch()``), built on the first such read.
    """

    def __init__(self, device_type: str, mesh, *, mesh_dim_names=None):
        cpp, groups = _mesh_over_ranks(device_type, mesh, mesh_dim_names)
        self._attach(cpp, None, groups)
        _made(self)

    @classmethod
    def _wrap(cls, cpp_mesh, torch_mesh=None, groups=None, private=False) -> "DeviceMesh":
        """Ours over a C++ mesh already built (init_device_mesh, sub-meshes, interop)."""
        mesh = cls.__new__(cls)
        mesh._private = private
        mesh._attach(cpp_mesh, torch_mesh, groups)
        return mesh

    # The mesh this one is a dim of (mesh["tp"] of a ("dp", "tp") mesh), and which dim: how
    # fully_shard finds the mesh a tensor-parallel parameter and the data-parallel dim share.
    _parent = None
    # A mesh shardtensor keeps for its own use (fully_shard's prefetch twins: fsdp/_prefetch.py):
    # the same layout as a program's mesh over other process groups. C++ meshes compare by
    # layout, so a private one stays out of the lookups by C++ mesh (_BY_CPP), which would
    # otherwise hand it to the program's tensors.
    _private = False

    def _attach(self, cpp_mesh, torch_mesh, groups) -> None:
        self._cpp = cpp_mesh
        self._torch_mesh = torch_mesh
        self._groups = groups  # this rank's ProcessGroup per mesh dim
        self._subs = {}  # mesh dim -> the 1-d mesh along it (__getitem__)
        if not self._private:
            _BY_CPP[cpp_mesh] = self

    # ---- shape and this rank's place ----
    @property
    def device_type(self) -> str:
        return self._cpp.device_type

    @property
    def ndim(self) -> int:
        return self._cpp.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._cpp.shape)

    @property
    def mesh_dim_names(self) -> tuple[str, ...] | None:
        return tuple(self._cpp.dim_names) or None

    @property
    def mesh(self) -> torch.Tensor:
        """The global ranks at every coordinate, as DTensor's DeviceMesh.mesh."""
        return torch.tensor(self._cpp.ranks, dtype=torch.int).reshape(self.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        if mesh_dim is None:
            return self._cpp.size()
        return self._cpp.size(self._dim(mesh_dim))

    def get_rank(self) -> int:
        return self._cpp.rank

    def get_coordinate(self) -> list[int] | None:
        """This rank's coordinate; None where the mesh leaves this rank out (as DTensor's)."""
        return list(self._cpp.coordinate) if self._cpp.includes_this_rank else None

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise ValueError(f"get_local_rank: this mesh has {self.ndim} dims; name one")
            mesh_dim = 0
        return self._cpp.coordinate[self._dim(mesh_dim)]

    def get_group(self, mesh_dim: int | str | None = None):
        """The torch.distributed ProcessGroup of this rank's slice along `mesh_dim`."""
        if mesh_dim is None and self.ndim != 1:
            raise ValueError(f"get_group: this mesh has {self.ndim} dims; name one")
        d = 0 if mesh_dim is None else self._dim(mesh_dim)
        if self._groups is not None:
            return self._groups[d]
        if self._torch_mesh is not None:
            return self._torch_mesh.get_group(d)
        raise RuntimeError("get_group: this mesh was not built over torch.distributed groups")

    def to_torch(self):
        """torch's own DeviceMesh over the same process groups (for DTensor interop)."""
        if self._torch_mesh is None and self._parent is not None and self._parent[0].mesh_dim_names:
            # torch's sub-mesh of torch's mesh of the parent: sub-meshes of one mesh then share
            # one torch root, which torch's mesh concatenation and FSDP2's 2-D path require.
            parent, d = self._parent
            self._torch_mesh = parent.to_torch()[parent.mesh_dim_names[d]]
        if self._torch_mesh is None:
            if self._groups is None:
                raise RuntimeError("this mesh was not built over torch.distributed groups")
            from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh

            self._torch_mesh = TorchDeviceMesh.from_group(
                self._groups if self.ndim > 1 else self._groups[0], self.device_type,
                mesh=self.mesh if self.ndim > 1 else None, mesh_dim_names=self.mesh_dim_names)
        return self._torch_mesh

    def __getattr__(self, name: str):
        # Reached only for names this class and torch's do not define as such: torch's private
        # state (_layout, _root_mesh, ...), which its inherited methods and its FSDP read.
        if name.startswith("__") or name in ("_cpp", "_torch_mesh", "_groups", "_parent", "_subs"):
            raise AttributeError(name)
        return getattr(self.to_torch(), name)

    @property
    def _root_mesh(self):
        # torch's class declares it with a default (None), so __getattr__ never sees it: the
        # root of torch's mesh, shared by the sub-meshes of one mesh (to_torch).
        return self.to_torch()._root_mesh

    def __getitem__(self, name: str) -> "DeviceMesh":
        """The 1-d mesh along the named dim through this rank (mesh['tp'])."""
        d = self._dim(name)
        if d in self._subs:
            return self._subs[d]
        sub = self._cpp.submesh(d)
        found = _BY_CPP.get(sub)
        groups = [self._groups[d]] if self._groups is not None else None
        torch_sub = None
        if groups is None and self._torch_mesh is not None and self.mesh_dim_names:
            torch_sub = self._torch_mesh[self.mesh_dim_names[d]]
        # A new wrapper even where an equal mesh exists (the world's, for a dim of all ranks): this
        # one knows its parent, and its torch mesh is a sub-mesh of the parent's. Tensors on the
        # equal mesh keep naming the wrapper they had.
        sub_mesh = DeviceMesh._wrap(sub, torch_sub, groups)
        sub_mesh._parent = (self, d)
        self._subs[d] = sub_mesh
        if found is not None:
            _BY_CPP[sub] = found
        return sub_mesh

    def _dim(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if mesh_dim not in (self.mesh_dim_names or ()):
                # KeyError, as DTensor's DeviceMesh raises for a name it does not have.
                raise KeyError(f"mesh dim name {mesh_dim!r} is not one of this mesh's mesh_dim_names "
                               f"{self.mesh_dim_names}")
            return self._cpp.mesh_dim(mesh_dim)
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh dim {mesh_dim} is out of range for a {self.ndim}-d mesh")
        return mesh_dim % self.ndim

    def __eq__(self, other):
        return isinstance(other, DeviceMesh) and self._cpp == other._cpp

    def __hash__(self):
        return hash(self._cpp)

    # A mesh is immutable and stands for process groups, which cannot be copied: a copy is the
    # mesh itself, so copy.deepcopy(module) of a module that holds one works, as with torch's.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        # Groups do not pickle; what does is the mesh's identity, looked up among the live meshes
        # of the process that unpickles it.
        return _live_mesh, (self.device_type, self.shape, tuple(self._cpp.ranks), self.mesh_dim_names)

    def __fx_repr__(self):
        """How a compiled graph names this mesh, a constant of the trace (_compile.py)."""
        if self not in _IN_GRAPHS:
            _IN_GRAPHS.append(self)
        return f"_shardtensor_mesh({_IN_GRAPHS.index(self)})", {"_shardtensor_mesh": _IN_GRAPHS.__getitem__}

    def __repr__(self):
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"


# Meshes by their C++ handle, so that x.device_mesh returns the object the program built.
_BY_CPP: dict = {}

# The mesh the program built last (init_device_mesh, DeviceMesh(...)): what a call that names no
# mesh means outside every `with mesh:`. Sub-meshes, meshes looked up or converted do not count.
_made_last = None  # a weakref.ref


def _made(mesh: DeviceMesh) -> DeviceMesh:
    global _made_last
    _made_last = weakref.ref(mesh)
    return mesh


def current_mesh() -> DeviceMesh | None:
    """The mesh a call that names none means: the innermost ``with mesh:`` (torch's own mesh
    stack, so that it means the same to DTensor's calls; a torch DeviceMesh there is converted),
    else the mesh the program built last, else None."""
    stack = torch.distributed.device_mesh._mesh_resources.mesh_stack
    if stack:
        innermost = stack[-1]
        return innermost if isinstance(innermost, DeviceMesh) else from_torch_mesh(innermost)
    return _made_last() if _made_last is not None else None


def _live_mesh(device_type: str, shape: tuple, ranks: tuple, mesh_dim_names) -> DeviceMesh:
    """The live mesh a pickled one names (DeviceMesh.__reduce__): the most recent of this
    process's meshes with that device type, shape, rank layout and dim names."""
    for mesh in reversed(list(_BY_CPP.values())):
        if (mesh.device_type, mesh.shape, tuple(mesh._cpp.ranks), mesh.mesh_dim_names) == (
                device_type, tuple(shape), tuple(ranks), mesh_dim_names):
            return mesh
    names = f", mesh_dim_names={mesh_dim_names}" if mesh_dim_names else ""
    raise RuntimeError(f"unpickling DeviceMesh('{device_type}', shape {tuple(shape)}, ranks {list(ranks)}{names}): no such "
                       "mesh lives in this process. A mesh stands for process groups, which do not pickle: build the "
                       "same mesh here first (init_device_mesh / DeviceMesh), then unpickle")


def mesh_of_cpp(cpp_mesh) -> DeviceMesh:
    found = _BY_CPP.get(cpp_mesh)
    return found if found is not None else DeviceMesh._wrap(cpp_mesh)


def shutdown() -> None:
    """At exit: drop shardtensor's references to process groups, and destroy the default group if
    shardtensor created it (a program that created its own destroys it itself)."""
    global _made_last
    prefetch = sys.modules.get("shardtensor.fsdp._prefetch")  # loaded only if fully_shard was
    if prefetch is not None:
        prefetch.shutdown()
    _BY_CPP.clear()
    _OF_DIMS.clear()
    _made_last = None
    _C.release_cached_layouts()
    _C.release_communicators()
    if _initialised_here and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _forget_destroyed_world_group()


def _forget_destroyed_world_group() -> None:
    """Lets a destroyed world group be freed now, while the interpreter still runs.

    torch.distributed.nn.functional binds ``group.WORLD`` as the default ``group`` of ten
    functions when it is imported. Imported after init_process_group (torch._dynamo imports it,
    and so do CommDebugMode's module tracker and torch.compile), those defaults keep the world
    group and its Gloo worker threads alive after destroy_process_group. A worker that frees the
    Python tensors of the last collective after the interpreter began to finalize cannot take
    the GIL and aborts the process ("terminate called without an active exception", about one
    exit in 25 on torch 2.15, shardtensor or not). With the group destroyed, the defaults go back
    to None (the default group, as before init); the last reference then goes here, and torch
    joins the workers with the GIL released."""
    functional = sys.modules.get("torch.distributed.nn.functional")
    if functional is None or not dist.is_available() or dist.is_initialized():
        return
    for fn in vars(functional).values():
        defaults = getattr(fn, "__defaults__", None)
        if defaults and any(isinstance(d, dist.ProcessGroup) for d in defaults):
            fn.__defaults__ = tuple(None if isinstance(d, dist.ProcessGroup) else d for d in defaults)


def init_device_mesh(device_type: str, mesh_shape, *, mesh_dim_names=None) -> DeviceMesh:
    """A mesh of `mesh_shape` over all ranks, in rank order (the same layout as DTensor's).

    Its groups come from torch.distributed: the world group for a 1-d mesh, new_group() per
    slice otherwise. torch's own DeviceMesh over the same groups is made only when asked for
    (get_group does not need it; to_torch and to_dtensor do).
    """
    mesh_shape = tuple(int(s) for s in mesh_shape)
    if mesh_dim_names is not None and len(mesh_dim_names) != len(mesh_shape):
        raise ValueError(f"init_device_mesh: {len(mesh_dim_names)} mesh_dim_names {tuple(mesh_dim_names)} for a "
                         f"{len(mesh_shape)}-d mesh_shape {mesh_shape}")
    if not mesh_shape or any(s < 1 for s in mesh_shape):
        raise ValueError(f"init_device_mesh: mesh_shape {mesh_shape} must have at least one dim, each >= 1")
    _ensure_process_group(device_type)
    world = dist.get_world_size()
    layout = torch.arange(world).reshape(-1)
    if layout.numel() != _product(mesh_shape):
        raise ValueError(f"init_device_mesh: mesh_shape {mesh_shape} holds {_product(mesh_shape)} ranks, but the "
                         f"world has {world}")
    layout = layout.reshape(mesh_shape)
    groups = [_slice_groups(layout, d) for d in range(len(mesh_shape))]
    names = list(mesh_dim_names or ())
    cpp = _C.DeviceMesh.from_process_groups(list(mesh_shape), layout.flatten().tolist(), groups, names, device_type,
                                            collective_timeout_s(), dist.group.WORLD if len(mesh_shape) > 1 else None)
    return _made(DeviceMesh._wrap(cpp, groups=groups))


def _product(values) -> int:
    n = 1
    for v in values:
        n *= v
    return n


def _slice_groups(layout: torch.Tensor, mesh_dim: int):
    """This rank's group along `mesh_dim` (None where no slice holds it). Every rank creates
    every slice's group, in one order, as torch.distributed.new_group requires."""
    if layout.dim() == 1 and layout.tolist() == list(range(dist.get_world_size())):
        return dist.group.WORLD
    me = dist.get_rank()
    slices = layout.movedim(mesh_dim, -1).reshape(-1, layout.shape[mesh_dim])
    mine = None
    for ranks in slices.tolist():
        group = dist.new_group(ranks=ranks)
        if me in ranks:
            mine = group
    return mine


def _mesh_over_ranks(device_type: str, mesh, mesh_dim_names):
    """The C++ mesh laying out the global ranks of `mesh` (nested lists or a tensor), over
    torch.distributed groups, and this rank's group per mesh dim (None outside the mesh)."""
    _ensure_process_group(device_type)
    layout = torch.as_tensor(mesh, dtype=torch.long)
    world = dist.get_world_size()
    ranks = layout.flatten().tolist()
    if layout.dim() == 0 or layout.numel() == 0:
        raise ValueError(f"DeviceMesh: mesh {layout.tolist()} must be a non-empty list (or nested lists) of ranks")
    if mesh_dim_names is not None and len(mesh_dim_names) != layout.dim():
        raise ValueError(f"DeviceMesh: {len(mesh_dim_names)} mesh_dim_names {tuple(mesh_dim_names)} for a "
                         f"{layout.dim()}-d mesh")
    if any(not 0 <= r < world for r in ranks) or len(set(ranks)) != len(ranks):
        raise ValueError(f"DeviceMesh: mesh {layout.tolist()} must list distinct ranks of the world (0..{world - 1})")
    for d in range(layout.dim()):
        for ranks_along in layout.movedim(d, -1).reshape(-1, layout.shape[d]).tolist():
            if ranks_along != sorted(ranks_along):
                # torch.distributed.new_group orders a group's ranks, so its group rank could not
                # be the mesh coordinate.
                raise ValueError(f"DeviceMesh: the ranks {ranks_along} along mesh dim {d} of {layout.tolist()} are "
                                 f"not in increasing order; torch.distributed groups order their ranks, so lay the "
                                 f"mesh out with increasing ranks along every dim")
    groups = [_slice_groups(layout, d) for d in range(layout.dim())]
    inside = dist.get_rank() in ranks
    mesh_group = None
    if layout.dim() > 1:  # group rank = row-major position, since the ranks increase row-major
        whole = dist.new_group(ranks=ranks) if ranks == sorted(ranks) else None
        mesh_group = whole if inside else None
    cpp = _C.DeviceMesh.from_process_groups(list(layout.shape), ranks, groups, list(mesh_dim_names or ()), device_type,
                                            collective_timeout_s(), mesh_group)
    return cpp, groups


def from_torch_mesh(torch_mesh) -> DeviceMesh:
    """Our mesh over the process groups of torch's DeviceMesh (no new rendezvous)."""
    for mesh in _BY_CPP.values():
        if mesh._torch_mesh is torch_mesh:
            return mesh
    _ensure_process_group(torch_mesh.device_type)
    shape = list(torch_mesh.mesh.shape)
    ranks = torch_mesh.mesh.flatten().tolist()
    groups = [torch_mesh.get_group(d) for d in range(len(shape))]
    mesh_group = None
    if len(shape) > 1 and sorted(ranks) == ranks and len(ranks) == dist.get_world_size():
        mesh_group = dist.group.WORLD  # its group rank is the row-major position
    cpp = _C.DeviceMesh.from_process_groups(shape, ranks, groups, list(torch_mesh.mesh_dim_names or ()),
                                            torch_mesh.device_type, collective_timeout_s(), mesh_group)
    return DeviceMesh._wrap(cpp, torch_mesh)


def mesh_of_dims(root: DeviceMesh, dims) -> DeviceMesh:
    """The mesh of `root`'s dims `dims`, in that order, through this rank (the other dims fixed at
    this rank's coordinate), over root's own groups per dim and a mesh-wide group of its own
    (built through the store: torch.distributed orders a group's ranks, and this layout's
    row-major order may not be theirs), so every rank of the mesh builds it, in one order.
    ``mesh_of_dims(mesh_2d, [1, 0])`` is the transposed mesh, whose first dim splits a tensor dim
    first when both shard it (how fully_shard nests "dp" inside "tp")."""
    dims = [root._dim(d) for d in dims]
    if dims == list(range(root.ndim)):
        return root
    key = (root._cpp, tuple(dims), root._private)
    found = _OF_DIMS.get(key)
    if found is not None:
        return found
    coordinate = root.get_coordinate()
    if coordinate is None:
        raise ValueError(f"the mesh {root} does not include rank {dist.get_rank()}")
    index = tuple(slice(None) if d in dims else coordinate[d] for d in range(root.ndim))
    kept = sorted(dims)
    layout = root.mesh[index].permute([kept.index(d) for d in dims])
    names = [root.mesh_dim_names[d] for d in dims] if root.mesh_dim_names else []
    groups = [root.get_group(d) for d in dims]
    cpp = _C.DeviceMesh.from_process_groups(list(layout.shape), layout.flatten().tolist(), groups, names,
                                            root.device_type, root._cpp.timeout_s, None,
                                            build_mesh_group_through=dist.distributed_c10d._get_default_store())
    mesh = DeviceMesh._wrap(cpp, groups=groups, private=root._private)
    _OF_DIMS[key] = mesh
    return mesh


def root_and_dims(mesh: DeviceMesh):
    """(the mesh `mesh` was sliced from, `mesh`'s dims in it): (root, [d]) for mesh["name"], else
    (mesh, all its dims)."""
    if mesh._parent is not None:
        root, d = mesh._parent
        return root, [d]
    return mesh, list(range(mesh.ndim))


_OF_DIMS: dict = {}
