"""The regions one worker process has mapped: clients' regions its batches' tensors lie in, and
other instances' arenas it reads in place (an ensemble's intermediates, BLS outputs).

The worker maps a region, by id, before it reads the first frame that uses it (a Map frame
sent just before), and unmaps it when the region's Region says so (it was retired and no
request uses it). A new process of the instance starts with none mapped: the old one took its
mappings along. A model's large BLS inputs are located in these regions or in the instance's
own BLS arena (`bls_slice`).
"""

from typing import Callable

from shmserve.dispatch.memory_regions import CudaRegion, Region, RegionSlice, SystemRegion
from shmserve.ipc import locations, messages
from shmserve.ipc.locations import InCallArena, InRegion


class MappedRegions:
    def __init__(self, holder, send: Callable[[object], None]):
        """`holder`: who each region records as having mapped it (Region.mapped_by), which
        it tells to unmap it in the end (the instance's WorkerHandle); `send(frame)` sends a
        frame to the instance's current process."""
        self._holder = holder
        self._send = send
        self._by_id: dict[int, Region] = {}

    def clear(self) -> None:
        """A new process starts, with nothing mapped."""
        self._by_id = {}

    def map_batch(self, batch: list) -> None:
        """Tell the worker of the client regions the batch uses that it has not mapped yet."""
        for req in batch:
            for region in req.regions:
                if region.region_id not in self._by_id:
                    self.map(region)

    def map(self, region: Region) -> None:
        """Have the worker map `region` before it reads the next frame, unless it has."""
        if region.region_id in self._by_id:
            return
        self._send(_map_message(region))
        self._by_id[region.region_id] = region
        region.mapped_by.add(self._holder)

    def unmap(self, region_id: int, tell: bool) -> None:
        """The region is gone and no request uses it any more: the worker unmaps it, if it is
        told (`tell`: it is alive)."""
        if region_id not in self._by_id:
            return  # mapped by an earlier process of this instance, which took it along
        del self._by_id[region_id]
        if tell:
            try:
                self._send(messages.UnmapRegion(region_id))
            except ConnectionError:
                pass

    def bls_slice(self, location: list, bls_region: Region | None) -> RegionSlice:
        """Where a BLS input lies, by the location array the model's call carried: InCallArena
        in the model's BLS arena (`bls_region`), or InRegion of a region this process has
        mapped (an input of its own passed on as it came). ValueError when it is neither,
        there is no such region or the range leaves it."""
        loc = locations.checked(location)
        if type(loc) is InCallArena:
            region, offset, nbytes = bls_region, loc.offset, loc.nbytes
            where = "the BLS arena"
        elif type(loc) is InRegion:
            region, offset, nbytes = self._by_id.get(loc.region_id), loc.offset, loc.nbytes
            where = f"a region this instance has mapped (id {loc.region_id})"
        else:
            raise ValueError(f"a BLS input cannot lie in {type(loc).__name__}")
        if region is None or type(offset) is not int or type(nbytes) is not int \
                or offset < 0 or nbytes < 0 or offset + nbytes > region.byte_size:
            raise ValueError(f"range [{offset}, {offset}+{nbytes}) is outside {where}")
        return RegionSlice(region, offset, nbytes)


def _map_message(region: Region):
    if isinstance(region, CudaRegion):
        return messages.MapCudaRegion(region.region_id, region.raw_handle, region.device_id,
                                      region.byte_size)
    assert isinstance(region, SystemRegion)  # the only other kind of region
    return messages.MapSystemRegion(region.region_id, region.key, region.offset,
                                    region.byte_size, list(region.identity))
