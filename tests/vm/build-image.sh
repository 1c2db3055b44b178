#!/usr/bin/env bash
# tests/vm/build-image.sh: build (once) and cache the Debian bookworm image of the Soft-RoCE VM.
#
# Usage: tests/vm/build-image.sh [--force]
#   Prints the image directory on stdout (its only output there); progress goes to stderr.
#   The directory holds root.ext4 (raw ext4, boot it with -snapshot), vmlinuz, initrd.img,
#   packages.txt (installed versions) and build.log.
#   --force   rebuild even when an image with the current key exists.
#
# The image is cached in $RDMASCHED_VM_CACHE/images/<key> (default /var/cache/rdmasched-vm).
# The key hashes this script, lib.sh, guest-packages.txt and guest-wheels.txt: change any of
# them and the next call builds a new image. Builds run in a temporary directory under a lock and are renamed
# into place at the end, so an interrupted build leaves nothing that looks finished, and two
# concurrent calls build once. Downloaded .debs are kept in $RDMASCHED_VM_CACHE/debs.
#
# How: debootstrap --foreign (minbase), then the second stage in a chroot with dpkg's
# force-unsafe-io and an initramfs-tools configuration (MODULES=list + a hook that loads
# virtio_pci, virtio_blk and ext4) already in place, so the kernel's postinst builds the small
# initrd once. Then kernel modules and documentation are trimmed and `mkfs.ext4 -d` makes the
# image from the directory (no loop mount).
#
# Exit codes: 0 ok, 2 usage, 120 the host could not build the image (packages, network, disk).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

readonly SUITE=bookworm ARCH=amd64

force=0
while (($#)); do
    case $1 in
    --force) force=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
        exit 0
        ;;
    *) vm_die "$VM_EXIT_USAGE" "unknown argument: $1 (usage: build-image.sh [--force])" ;;
    esac
    shift
done

((EUID == 0)) || vm_die "$VM_EXIT_HOST" "build-image.sh needs root (debootstrap, chroot)"

# The guest package list: guest-packages.txt without comments and blank lines.
mapfile -t packages < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$here/guest-packages.txt")
((${#packages[@]})) || vm_die "$VM_EXIT_HOST" "guest-packages.txt lists no packages"

key=$(cat "$here/build-image.sh" "$here/lib.sh" "$here/guest-packages.txt" "$here/guest-wheels.txt" |
    sha256sum | cut -c1-16)
cache=$(vm_cache_dir)
image="$cache/images/$SUITE-$ARCH-$key"

mkdir -p "$cache/images" "$cache/debs" "$cache/tmp" ||
    vm_die "$VM_EXIT_HOST" "cannot create the cache directory $cache (set RDMASCHED_VM_CACHE)"

# Whoever holds the lock is the only builder, so anything in tmp/ is from an interrupted
# build (killed hard, it may still have /proc and /sys mounted inside): clear it.
clean_stale() {
    local stale
    for stale in "$cache"/tmp/*; do
        [[ -e $stale ]] || continue
        vm_log "removing an interrupted build: $stale"
        vm_umount_under "$stale"
        rm -rf --one-file-system -- "$stale"
    done
}

# One builder at a time; whoever waited finds the image that the other one built.
exec {lock_fd}>"$cache/.lock"
if ((!force)) && [[ -f $image/ok ]]; then
    if flock -n "$lock_fd"; then
        clean_stale
    fi
    vm_log "image cached: $image"
    printf '%s\n' "$image"
    exit 0
fi
if ! flock -n "$lock_fd"; then
    vm_log "another build holds $cache/.lock; waiting for it"
    flock "$lock_fd"
fi
if ((!force)) && [[ -f $image/ok ]]; then
    vm_log "image cached: $image"
    printf '%s\n' "$image"
    exit 0
fi
clean_stale

vm_ensure_host_packages debootstrap:debootstrap mkfs.ext4:e2fsprogs chroot:coreutils

work=$(mktemp -d "$cache/tmp/build.XXXXXX")
root="$work/root"
buildlog="$work/build.log"
cleanup() {
    vm_umount_under "$work"
    rm -rf --one-file-system -- "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# run_logged DESCRIPTION COMMAND...: runs COMMAND with its output in build.log; on failure
# prints the log's tail and exits.
run_logged() {
    local what=$1 t0=$SECONDS
    shift
    vm_log "$what"
    printf '\n### %s\n' "$what" >>"$buildlog"
    if ! "$@" >>"$buildlog" 2>&1; then
        tail -n 40 "$buildlog" >&2
        vm_die "$VM_EXIT_HOST" "image build failed at: $what (log above)"
    fi
    vm_log "  done in $((SECONDS - t0)) s"
}

mirror=$(vm_detect_mirror)
vm_log "building image $SUITE-$ARCH-$key from $mirror (${#packages[@]} packages) in $work"

include=$(IFS=,; printf '%s' "${packages[*]}")
# First stage: download (into the .deb cache) and unpack. One retry for a network hiccup.
first_stage() {
    local try
    for try in 1 2; do
        debootstrap --foreign --variant=minbase --arch="$ARCH" --cache-dir="$cache/debs" \
            --include="$include" "$SUITE" "$root" "$mirror" && return 0
        echo "debootstrap first stage failed (try $try)"
        vm_umount_under "$root"
        rm -rf --one-file-system -- "$root"
        sleep 5
    done
    return 1
}
run_logged "debootstrap: download and unpack" first_stage
# the .debs this build uses: the others in the cache are pruned once the image is built
awk '{n = $2; sub(/.*\//, "", n); print n}' "$root/debootstrap/debpaths" >"$work/debs.used"

# Before the second stage configures the packages: no fsync per file (a throwaway root),
# and the small initrd, so the kernel's postinst builds it once and quickly.
mkdir -p "$root/etc/dpkg/dpkg.cfg.d" "$root/etc/initramfs-tools/conf.d" \
    "$root/etc/initramfs-tools/hooks"
echo force-unsafe-io >"$root/etc/dpkg/dpkg.cfg.d/rdmasched-unsafe-io"
cat >"$root/etc/initramfs-tools/conf.d/rdmasched" <<'EOF'
# rdmasched test VM: only the modules that mounting the root needs (the hook below)
MODULES=list
COMPRESS=gzip
EOF
cat >"$root/etc/initramfs-tools/hooks/rdmasched" <<'EOF'
#!/bin/sh
# rdmasched test VM: root is ext4 on virtio-blk behind virtio-pci
PREREQ=""
prereqs() { echo "$PREREQ"; }
case "$1" in prereqs) prereqs; exit 0 ;; esac
. /usr/share/initramfs-tools/hook-functions
for m in virtio_pci virtio_blk ext4; do force_load "$m"; done
EOF
chmod 0755 "$root/etc/initramfs-tools/hooks/rdmasched"

run_logged "debootstrap: configure packages (chroot, second stage)" \
    chroot "$root" /debootstrap/debootstrap --second-stage
rm -f "$root/etc/dpkg/dpkg.cfg.d/rdmasched-unsafe-io"

# Python packages Debian does not ship (guest-wheels.txt): binary wheels for the guest's
# Python 3.11 and x86_64, downloaded on the host with pip (the checkout's .venv if set up,
# else python3's) and unpacked into the guest's dist-packages.
mapfile -t wheels < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$here/guest-wheels.txt")
if ((${#wheels[@]})); then
    pip=(python3 -m pip)
    [[ -x $here/../../.venv/bin/python ]] && pip=("$here/../../.venv/bin/python" -m pip)
    run_logged "pip download (guest wheels: ${wheels[*]})" \
        "${pip[@]}" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.11 -d "$work/wheels" "${wheels[@]}"
    for whl in "$work"/wheels/*.whl; do
        python3 -m zipfile -e "$whl" "$root/usr/lib/python3/dist-packages/" ||
            vm_die "$VM_EXIT_HOST" "cannot unpack $whl into the image"
    done
fi

# ---- configure the guest -------------------------------------------------------------------
vm_log "configuring the guest"
echo rdmasched-vm >"$root/etc/hostname"
cat >"$root/etc/hosts" <<'EOF'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
198.51.100.1	rdmasched-a
198.51.100.2	rdmasched-b
EOF
printf '# rdmasched test VM: root is mounted by the kernel command line\n' >"$root/etc/fstab"

# PID 1 of the VM. It mounts the per-run control share and hands over to the guest-init.sh
# that run-in-vm.sh put there, so changing the guest's steps never needs a new image.
cat >"$root/sbin/rdmasched-init" <<'EOF'
#!/bin/bash
# rdmasched test VM init (baked into the image by tests/vm/build-image.sh)
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mountpoint -q /run || mount -t tmpfs -o mode=0755 tmpfs /run
ctl=/run/rdmasched-ctl
mkdir -p "$ctl"
if modprobe -a 9pnet_virtio 9p &&
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 rsctl "$ctl" &&
    [ -r "$ctl/guest-init.sh" ]; then
    exec /bin/bash "$ctl/guest-init.sh"
fi
echo "rdmasched-init: no control share (rsctl) with guest-init.sh; start this image with tests/vm/run-in-vm.sh" >&2
echo o >/proc/sysrq-trigger
sleep 10
EOF
chmod 0755 "$root/sbin/rdmasched-init"

# ---- trim ------------------------------------------------------------------------------------
vm_log "trimming the root file system"
kver=$(basename "$(find "$root/usr/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n 1)")
[[ -n $kver && -e $root/boot/vmlinuz-$kver ]] || vm_die "$VM_EXIT_HOST" "no kernel found in the image"
# Whole driver families a virtio guest never loads. Kept on purpose: crypto/ and arch/ (rxe
# loads a crc32 implementation by name), lib/, net/ (ipv4/6, 9p, udp tunnels), fs/ext4 and
# fs/9p with their helpers, drivers/infiniband/{core,sw}, drivers/net (virtio_net, dummy, veth).
(
    cd "$root/usr/lib/modules/$kver/kernel"
    rm -rf sound drivers/{gpu,media,staging,scsi,usb,input,hid,iio,isdn,bluetooth,mtd,mmc} \
        drivers/{hwmon,platform,nfc,ata,target,md,firewire,video,leds,power,i2c,spi,gnss} \
        drivers/{thunderbolt,pinctrl,edac,watchdog,atm,misc,mfd,regulator,comedi,w1,ptp} \
        drivers/{memstick,pcmcia,parport,ntb,soundwire,extcon,counter,fpga,uio,vdpa} \
        drivers/infiniband/{hw,ulp} \
        drivers/net/{wireless,ethernet,can,usb,wwan,ieee802154,fddi,hamradio,wan,phy,pcs,mdio,plip} \
        net/{wireless,mac80211,bluetooth,nfc,sunrpc,ceph,rxrpc,6lowpan,ieee802154,mac802154} \
        fs/{btrfs,xfs,ocfs2,nfs,nfsd,ceph,smb,cifs,f2fs,gfs2,ubifs,jfs,reiserfs,nilfs2,dlm,ntfs3} \
        fs/{ntfs,orangefs,afs,coda,hfs,hfsplus,ufs,udf,isofs,lockd,nfs_common,erofs,gfs2,bcachefs}
)
run_logged "depmod" chroot "$root" depmod -a "$kver"
for m in rdma_rxe ib_uverbs rdma_ucm dummy veth virtio_net 9p 9pnet_virtio ext4 virtio_blk \
    crc32_generic; do
    chroot "$root" modprobe -S "$kver" --show-depends "$m" >/dev/null 2>&1 ||
        vm_die "$VM_EXIT_HOST" "module $m missing after trimming (tests/vm/build-image.sh)"
done
rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,linda}/* "$root"/var/lib/apt/lists/* \
    "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old "$root"/var/log/*.log

# shellcheck disable=SC2016  # dpkg-query's own format, not shell
chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' >"$work/packages.txt"

# ---- kernel, initrd, disk image --------------------------------------------------------------
mkdir -p "$work/image"
mv "$root/boot/vmlinuz-$kver" "$work/image/vmlinuz"
mv "$root/boot/initrd.img-$kver" "$work/image/initrd.img"
rm -f "$root/boot/System.map-$kver"
mv "$work/packages.txt" "$work/image/packages.txt"

used_mb=$(du -sm --apparent-size "$root" | cut -f1)
size_mb=$((used_mb + 1024 > 2048 ? used_mb + 1024 : 2048))
run_logged "mkfs.ext4 -d (root ${used_mb} MB, image ${size_mb} MB, sparse)" \
    mkfs.ext4 -q -F -L rdmasched-root -d "$root" "$work/image/root.ext4" "${size_mb}M"
cp "$buildlog" "$work/image/build.log"
{
    echo "key=$key"
    echo "suite=$SUITE arch=$ARCH kernel=$kver"
    echo "mirror=$mirror"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) seconds=$SECONDS"
    echo "packages=${packages[*]}"
} >"$work/image/manifest.txt"
touch "$work/image/ok"

rm -rf -- "$image"
mv "$work/image" "$image"

for deb in "$cache"/debs/*.deb; do
    [[ -e $deb ]] || continue
    grep -qxF "${deb##*/}" "$work/debs.used" || rm -f -- "$deb"
done

# Keep the two newest images: the one just built and its predecessor (another branch).
find "$cache/images" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' | sort -rn |
    tail -n +3 | cut -d' ' -f2- | while read -r old; do
    vm_log "removing an old image: $old"
    rm -rf --one-file-system -- "$old"
done
vm_log "image ready: $image (built in $SECONDS s)"
printf '%s\n' "$image"
