"""Debian 12 arm64's FFmpeg 5.1 for the two-architecture cluster's home
(issue 17: "torchcodec ... with an FFmpeg of a matching major on
LD_LIBRARY_PATH (runs)").

torchcodec 0.11's ``libtorchcodec_core5.so`` needs libavutil.so.57,
libavcodec.so.59, libavformat.so.59, libavdevice.so.59, libavfilter.so.8,
libswscale.so.6 and libswresample.so.4: bookworm's FFmpeg 5.1. A user who
brings them (a module, a conda env's lib, a tarball) puts them with
everything they need on ``LD_LIBRARY_PATH``. :func:`ffmpeg5_libs` makes that
directory: the pinned debs below (the DT_NEEDED closure of those seven
libraries minus what the node's root already has, resolved once against
Debian 12 and the guest root of :mod:`vm.slurmnode`; Depends without
Recommends), unpacked, and every library of the closure copied flat under
its soname. Flat, because some are found through RUNPATH or an
alternatives link on a real system (``pulseaudio/libpulsecommon``,
``blas/libblas.so.3``) and LD_LIBRARY_PATH comes before both.

Measured when the pins were resolved (2026-12): 159 packages, 78 MB of
debs; 176 libraries, 196 MB in the directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from corpus import CorpusUnavailable, _cached_tree

from grace_policy.elf import ElfError, read_elf

from . import images
from .slurmnode import SUITE, slurm_root

#: What libtorchcodec_core5.so names of FFmpeg (its DT_NEEDED, in order).
FFMPEG5_SONAMES = ("libavutil.so.57", "libavcodec.so.59", "libavformat.so.59",
                   "libavdevice.so.59", "libavfilter.so.8", "libswscale.so.6",
                   "libswresample.so.4")

#: Where the unpacked debs and the node root keep libraries.
_LIB_DIRS = ("lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib", "usr/lib",
             "usr/lib/aarch64-linux-gnu/blas", "usr/lib/aarch64-linux-gnu/lapack",
             "usr/lib/aarch64-linux-gnu/pulseaudio")

#: (package, version, sha256 of the .deb), bookworm arm64.
FFMPEG5_PINS: tuple[tuple[str, str, str], ...] = (
    ("libaom3", "3.6.0-1+deb12u2",
     "b3edf8d11a1e4e7957894717ba2c013f4f256000bdd47b634a2ffa3758a970d7"),
    ("libasound2", "1.2.8-1+b1",
     "9fa889400fcee4b92c8f4a2fafbb7f2cd33444d9ec1665a71002ab67c06114bb"),
    ("libass9", "1:0.17.1-1",
     "feb4cef72caf849fae2a13e1f757f9cc9fbfe3ddfb877e42cc888a7d313e298c"),
    ("libasyncns0", "0.8-6+b3",
     "30ec77ed3695fc09863427bf30e27318b74909089144ac24db17c3ab1f184a62"),
    ("libavc1394-0", "0.5.4-5",
     "5a6ad45da10d69ca6ca7757882fe696ace8af98fccac781697ef280ea13e770f"),
    ("libavcodec59", "7:5.1.9-0+deb12u1",
     "74468871b1b95f28476a3cb63deafe21c97e57289ac286e760384273b0c39fc1"),
    ("libavdevice59", "7:5.1.9-0+deb12u1",
     "46c574e3ca73624d88af636e89703820b1c57657090bd89eb02cef727076ed1b"),
    ("libavfilter8", "7:5.1.9-0+deb12u1",
     "6156525ccfd083bca35545a2b227839b2978f6d6c02cd10a1fe4691989e80a4e"),
    ("libavformat59", "7:5.1.9-0+deb12u1",
     "600ddadab359b552bc890323c9ca603bd0f08f4e324378e4530321c0f1900990"),
    ("libavutil57", "7:5.1.9-0+deb12u1",
     "9c5bd3feecf46c9eab1d6b4e65830acaf8e2d6caee008bd4f94e1adf22a63f31"),
    ("libblas3", "3.11.0-2",
     "054aec63b247d157b4b475ca26763538d5dcbd32894734db6b5cae6c7aa335f2"),
    ("libblkid1", "2.38.1-5+deb12u3",
     "6c462ce69d08f1ddaa9a77bbdad4af8e289267095599eb8e92a9ab3ea21cdc41"),
    ("libbluray2", "1:1.3.4-1",
     "f8f28e8e099f6c872053abf79755514a83d1cdc035b3774c29b0d75ebc7f0d11"),
    ("libbrotli1", "1.0.9-2+b6",
     "3137de7f71952e710ee9f0df05026b3c6f463be9369a502d57c7696732f1ed22"),
    ("libbs2b0", "3.1.0+dfsg-7",
     "6145ea38842a1cc5d2f49e1a00bfb65426024c8c8fe48edbe59d3f8366ef565b"),
    ("libbsd0", "0.11.7-2",
     "ef00f132ddd268ee67d756998723ee18543db27ab34930c0a9f1cff75cf55382"),
    ("libcaca0", "0.99.beta20-3+deb12u1",
     "2a1cba3e489daa6c7252fa435c51272a94fe195145505ec8cede89d69dda5e5f"),
    ("libcairo-gobject2", "1.16.0-7",
     "05a0e107ab9d7512b0ee9421da705c268b7381dc66041c188993f6fb4600792e"),
    ("libcairo2", "1.16.0-7",
     "48b5c5ae1972ea0757c6285463d611d0ca32c9c808957961e5c7924126f30289"),
    ("libcdio-cdda2", "10.2+2.0.1-1",
     "20515c1a5df7fce5c3ff41b5a5abf10f0294b485577ea4d461186ebc4e79c014"),
    ("libcdio-paranoia2", "10.2+2.0.1-1",
     "f960dc3ab9f6bd6aee925350a19736a86d44ef8326177ce8127ae8df443490b6"),
    ("libcdio19", "2.1.0-4",
     "f1b9c80716ba707e46ced45b454246b4b03f93ef9772e92af0e3b86ab0d56e2d"),
    ("libchromaprint1", "1.5.1-2+b1",
     "6f73d7b541247024746730858ebd5729acf6c017e189c2be25b13c6e7d92853f"),
    ("libcjson1", "1.7.15-1+deb12u4",
     "67b9f4d780a401b28bcce3d23a0a26efbdf040d7a012f1d73f8142a641925e2e"),
    ("libcodec2-1.0", "1.0.5-1",
     "13c5182958d011333d30e1459e5e72acb24a2b3433ac4dd027d35f1afdcb6338"),
    ("libdatrie1", "0.2.13-2+b1",
     "d7c52aa971278e7f298b7e74f8ed50ad25579f9b344212fd4a91744cffa58cc9"),
    ("libdav1d6", "1.0.0-2+deb12u1",
     "579c820b80ce3491143c411a342b3a222ce3a381c7c052e8c8501de5bace954f"),
    ("libdc1394-25", "2.2.6-4",
     "82c939e239dc710675344c25f792341d00b9c4329c0c62b4146e06ffe928310a"),
    ("libdecor-0-0", "0.1.1-2",
     "e88d3c2dd3336a97b8cf10ef270a264388fce81cedf8032b18f2a36b021bc6a3"),
    ("libdrm2", "2.4.114-1+b1",
     "f5f15a46d02cf5d9fa52d4f1c54b8cf80c398711ad771a9938b12399b8d8090c"),
    ("libepoxy0", "1.5.10-1",
     "f9cf8272b5abbcc872999347dc086dbacb4fb5896024f6d9d466369c26c1b9eb"),
    ("libflac12", "1.4.2+ds-2",
     "338f78e2a140ed4ffca36d4240a7fc6f7867999bea000762a0c1b3924245a868"),
    ("libflite1", "2.2-5",
     "a32d8cfe4eda5e98dc4332ffb2520d3fb65565265bb869eb101f6b8b21f0115d"),
    ("libfontconfig1", "2.14.1-4",
     "4836d9deca824883f0de33d4f8f3718ba776c6e7c80cd7c418b5a0f86c009b9e"),
    ("libfreetype6", "2.12.1+dfsg-5+deb12u4",
     "b8d32e54ebc9020637f8fa16b6afa64a5731e40845a6e01880d38d6f632237c9"),
    ("libfribidi0", "1.0.8-2.1",
     "8ab3adcf64b318252d37669468fecb8e0478e1cf5f096d065611ac7dda68ccf4"),
    ("libgbm1", "22.3.6-1+deb12u2",
     "f5c8fdddbf365259d74af270fb10f30d7fddb3fbe7b2ff62f0fdd556f8db0dc8"),
    ("libgdk-pixbuf-2.0-0", "2.42.10+dfsg-1+deb12u4",
     "1ee7ed6fa461a5421dbc541e85d169608bffe9e84558c0839a6a9009df6f7251"),
    ("libgfortran5", "12.2.0-14+deb12u1",
     "583497cf5a95960c11f2006586050375c4adbc4b0c569a7e7df346f2bf380cbc"),
    ("libgl1", "1.6.0-1",
     "f4043ab47f52325973d2b608514b3469b055b65c744861c7f378755a32e799d6"),
    ("libglib2.0-0", "2.74.6-2+deb12u9",
     "61d92fffada7e27fc0ed9d23e047b45bca3b2e3bfe1a918f4ec16559282859f4"),
    ("libglvnd0", "1.6.0-1",
     "d5063205fab5322ee686f33f87c6315b3fcd1335ea4e7bc8202b48ed4f9c9e83"),
    ("libglx0", "1.6.0-1",
     "523f9b71f75e48ae605d8ef298a4b03ade26ade9a808a85329a3bd82a54b9b0d"),
    ("libgme0", "0.6.3-6",
     "561758595dc64d42e3ef48da13f87025af713a6dd240631eb68334bfcfcf8c97"),
    ("libgmp10", "2:6.2.1+dfsg1-1.1",
     "9906387c1dd806518c915bd8616d072c741061d7fa26b222e52763456060b31a"),
    ("libgnutls30", "3.7.9-2+deb12u7",
     "84f7f70084c9179d6670f4a6ebdf32adc36c6e4741a3a118104377e18cfa977f"),
    ("libgomp1", "12.2.0-14+deb12u1",
     "a48b70dd1a95585466b40bd94564bce56ebcb2566e49ccdb6441e996aaab2098"),
    ("libgraphite2-3", "1.3.14-1+deb12u1",
     "fca82a3f01cb2cfe607efb6f21f489081716ddcf8a71e2f588d3d67ad39107a2"),
    ("libgsm1", "1.0.22-1",
     "4c0041b45a3e2535dfcdb91222fbd9cb2a79c9ba0e38d6d44ad727424b457775"),
    ("libharfbuzz0b", "6.0.0+dfsg-3",
     "64b1d4aa672dc4eda5e11b9ff8061122060fc7aba6ad16908c89a269ffa174ee"),
    ("libhogweed6", "3.8.1-2",
     "e653a1a7e5a44be0f7b6443dc6ac865d2504e49149660fc253655245965e157f"),
    ("libhwy1", "1.0.3-3+deb12u1",
     "bfd492bb0c5c5072c67ea053c3ca8863df67d14d066b4dddd519eeae8cbcd92f"),
    ("libicu72", "72.1-3+deb12u1",
     "4f5d892fd81110435e45ed0a5f1b12899d7ff989d51db283cbc043f5631646d8"),
    ("libidn2-0", "2.3.3-1+b1",
     "12a3efc056671bf1c1bed4c3444c2559c8d5e0c158a13316fc728f263b83ddc4"),
    ("libiec61883-0", "1.2.0-6+b1",
     "55dbcc899d6f647b0a6d0299f8430e3737059185c72f7d51ba8798ce797a140c"),
    ("libjack-jackd2-0", "1.9.21~dfsg-3",
     "9b4bef2006edefa4d015918b954b315a91829a3c5a34ca5f9ca1a752b90f4ea8"),
    ("libjpeg62-turbo", "1:2.1.5-2",
     "de66f186f3ff3c1d10c2e75ae056b019b3f7f091f51096a06cade48b2dea875b"),
    ("libjxl0.7", "0.7.0-10+deb12u1",
     "fc46d9d24c22e16726cc0fe131f52c4b3cc08db7ba408ef15173841bd3933f2e"),
    ("liblapack3", "3.11.0-2",
     "7f6310fbd910326a63dedd87da046cd6eff3f644e9c00173f3afce20b7b2a93e"),
    ("liblcms2-2", "2.14-2+deb12u1",
     "753a2c7baa2d0a84b7c6ca6e80bbe37beadc2410939e5b34cbb4341234428a92"),
    ("liblilv-0-0", "0.24.14-1",
     "e3c0ebc8374617e26fa81e87714dbcbf7a04002cd3a11470ec4240692bf29ced"),
    ("libmbedcrypto7", "2.28.3-1",
     "018c421355f3fbbf11a5132a2d5e3b2c2f6b057ead517002da5547be2817a731"),
    ("libmount1", "2.38.1-5+deb12u3",
     "b48877c1e60c2589d9e17f72d782cd2ab8a3fdaeda54f05920bcb26c9404b1e8"),
    ("libmp3lame0", "3.100-6",
     "4259ab5810ec52b03344e8c8fbcad330561ad6758f35f07233af3224d2824547"),
    ("libmpg123-0", "1.31.2-1+deb12u1",
     "a4348cc2939baabb498158c94229941d09fc42070af765dc45ef9b26eab727d2"),
    ("libmysofa1", "1.3.1~dfsg0-1",
     "ec983f89355ac7f22fc486eaabc10c5c6192c56f02aec0c0ff50a7ce8e86a9ea"),
    ("libnettle8", "3.8.1-2",
     "c945ff210df69cf7b95e935b8fa936e81c1c1f475355e3d5db83510b174f0cd6"),
    ("libnorm1", "1.5.9+dfsg-2",
     "3974ddba57ed9bbfff10a144baae64d647adbb38ebce5fa122e4f0dd16b77866"),
    ("libogg0", "1.3.5-3",
     "1a3e6c2a934a4099dcd982785d1563212fc6ad20f021a6f06aa0d6e6582416d3"),
    ("libopenal1", "1:1.19.1-2",
     "848f7cb93823c780ab58c0da67535316ef797666934d06ed6d64e902d4e2df11"),
    ("libopenjp2-7", "2.5.0-2+deb12u3",
     "c3cfa6f3ec67bb3caa361c21034df0a5a1c8359a16e00a460f62920fc07e561a"),
    ("libopenmpt0", "0.6.9-1",
     "168a759cc2cfec251b757527fae13989b2306a8f778627aedf61000378149a52"),
    ("libopus0", "1.3.1-3",
     "a7efb06da15cc7f1ffff62bfdd77ba43f2a2065b8b59185ad1d14031c5a9e354"),
    ("libp11-kit0", "0.24.1-2",
     "d1f1f55023e9fc085b9ebfc9c4113d2d2dab2dc6b81a337f274b75c95ad8dc0a"),
    ("libpango-1.0-0", "1.50.12+ds-1",
     "88afa1481f9e520a3068e85dad776ed09a3751c7638a877333af6cec927db3ee"),
    ("libpangocairo-1.0-0", "1.50.12+ds-1",
     "6a13b03932612d8515857f696376a6b4a8c25c8b52cee44c87a1a1edc5e9462a"),
    ("libpangoft2-1.0-0", "1.50.12+ds-1",
     "57f52f354ebe0cf818fe7f764d1b97d3127d19640e0ca6958ec49831883ee060"),
    ("libpgm-5.3-0", "5.3.128~dfsg-2",
     "6a632aa13cafe154d6212a57710f058405dd895fb62d464e16961b28d7325cbb"),
    ("libpixman-1-0", "0.42.2-1",
     "a18db1a3bdbad168c7168b528bbb07b47316ff9fe977206a780dcc21b376e501"),
    ("libplacebo208", "4.208.0-3",
     "ea1d0e24255b74e94155daaba32f4467d6a746447ce2dc4e6d122a670d600f6c"),
    ("libpng16-16", "1.6.39-2+deb12u5",
     "69aba3963ddfb11b98e5bf4b0d022f76b797436568884b10f2da32e0f4b8c2dd"),
    ("libpocketsphinx3", "0.8+5prealpha+1-15",
     "5792065cf9dc3e1c5413f1f87ba95845b3daf90ef542ed2786bf64c36b846a60"),
    ("libpostproc56", "7:5.1.9-0+deb12u1",
     "ffafb4b6fc84108c2113386fe2d9a7f8ab2c1bcb0dca1b8d84f2ccf4ecba6177"),
    ("libpulse0", "16.1+dfsg1-2+b1",
     "26f17e3457c5fce0104a6b2f0efb75a3256b24b32ca7cfda6266373758a930cb"),
    ("librabbitmq4", "0.11.0-1+deb12u2",
     "6e4cdedc6de5514b867df1b7cf7cc075fdb95e59ab84b439ea47f5f75d01c1e5"),
    ("librav1e0", "0.5.1-6",
     "054bff7e2f2dae8693e933d8505d1ad4d99a0c8bae5d5cfe47508b007cb44555"),
    ("libraw1394-11", "2.1.2-2",
     "81a1e9bd2b790aa7ce7c426dd1742d3310894b01f124bc41962331b834da6cc3"),
    ("librist4", "0.2.7+dfsg-1",
     "35df536e53aed81b4da5c4568ad7f98375318e6611ebaae4c4140e9a5c4ca2a9"),
    ("librsvg2-2", "2.54.7+dfsg-1~deb12u1",
     "35dde303686e97604b74268bec715a4c37147df878ff57497c802b4dcac6d20b"),
    ("librubberband2", "3.1.2+dfsg0-1",
     "fb97c395697ab03ce4d06d82ef293a6f1fef62ea79299b686d0f498eb6839d7e"),
    ("libsamplerate0", "0.2.2-3",
     "07f8fe4c8c54aa93e9ebc0f45bb6ca22421ad84234e5942b55d08b3b7819021f"),
    ("libsdl2-2.0-0", "2.26.5+dfsg-1",
     "7d875b119108a240015e7739c7a0de402616975281bcd8169cb434326fa93a66"),
    ("libserd-0-0", "0.30.16-1",
     "cf26049564c27b60e1de39c3207743ca05d9ee34e25d8ed4027033d1afa22852"),
    ("libshine3", "3.1.1-2",
     "d64982ddfbdfcef714dc35a760a752ab1f3739aaee8011bc5c3f03afa73f465f"),
    ("libslang2", "2.3.3-3",
     "9dafcae211f5fccd147858384dd4ef161fae8a7d681256aaa7a772cbce15df55"),
    ("libsnappy1v5", "1.1.9-3",
     "7d9a01c7f175cdc6f1ac23dde7b21c0ff840f098069e95a896fda56c824a5828"),
    ("libsndfile1", "1.2.0-1+deb12u1",
     "9113167979c64bae0a73d2ee0740e662b25bb45b2f76e4745ea27db9f43f7b24"),
    ("libsndio7.0", "1.9.0-0.3+b2",
     "e7c787895eacf8363a4dea6a0cb3237a78857691d8d53f60a1a3ffeea3819808"),
    ("libsodium23", "1.0.18-1+deb12u1",
     "9ba45ca22ac46604f1ac2a48cd1dc9f38f8e72bcd84e51f65be2c89400017d7d"),
    ("libsord-0-0", "0.16.14+git221008-1",
     "fbfcbb5115fc85c8e659ef283f1eb588f08c77d89f762feaa96589ad9143e58c"),
    ("libsoxr0", "0.1.3-4",
     "8f1b1780a5ced7a0821a8040d0f3ab5815acd5d2f38b12cca915a9a9d0ee28b7"),
    ("libspeex1", "1.2.1-2",
     "5fc81ad2d0ead5b811381fbb47ef98c1bf063c9283470d795541f3c1cb95991a"),
    ("libsphinxbase3", "0.8+5prealpha+1-16",
     "bd42e9aaf59b23e3c3d9014875b148e5cf056f0582d22ba9f882c09f57507060"),
    ("libsratom-0-0", "0.6.14-1",
     "a2f9d014bf2acaf67499b1cae7dd7f1a857a676d99849219b23ae2f4980a9b20"),
    ("libsrt1.5-gnutls", "1.5.1-1+deb12u1",
     "3cfb9d8d26459e3538473683a8e297429d0662eea4c51a01c736bf06608354c5"),
    ("libssh-gcrypt-4", "0.10.6-0+deb12u2",
     "d7ace2bc8e26344a72ae370e8f884a52a5e44a25f3a77fc11d455251ba77f065"),
    ("libsvtav1enc1", "1.4.1+dfsg-1",
     "8615692e13797a345b2aea777e396ad6f9c19e6ff49459625f9078bb33199afe"),
    ("libswresample4", "7:5.1.9-0+deb12u1",
     "c723d38ce00cdcbf779add81d90d3510525424dd174ce6880520a0147453ddeb"),
    ("libswscale6", "7:5.1.9-0+deb12u1",
     "deb1abe7e40fdc9f38f54d7a87d1d2601f54447198221c4e1bb98da64a60d1ef"),
    ("libtasn1-6", "4.19.0-2+deb12u1",
     "7e80513007e8a71b5e737d3307dedbb06712f9cfed05ec2fad6fc00de460cc5f"),
    ("libthai0", "0.1.29-1",
     "1374f50f4e96397f2830f3fdf09e95a5fe8e4d584fdc70dd187eec5f8832d08c"),
    ("libtheora0", "1.1.1+dfsg.1-16.1+deb12u1",
     "d9da79696a6a886a606ecbc259497978f4d616dcb61544011a48a0e0486dd105"),
    ("libtwolame0", "0.4.0-2",
     "73780c555796569a252ec5cf1ea919e59ef4031298bc4be1516a6a0e83f06b5a"),
    ("libudfread0", "1.1.2-1",
     "693e1e62806759c6f55585cd1884cc851ac9a1b0a3ea7df55c51176b0b450fd4"),
    ("libunistring2", "1.0-2",
     "05b0b7700bfe269ff7af61f45e92055d7ef4c532c9584e4e2a352cf0bd4de5b1"),
    ("libusb-1.0-0", "2:1.0.26-1",
     "e0648086b231c9204514d31480d517cb1b51e301ac39e69335a67d01ec785608"),
    ("libva-drm2", "2.17.0-1",
     "dd1c3981a81171f3886f14b56e2c13cb879111109e5b1e3e786c26641ab2cc2f"),
    ("libva-x11-2", "2.17.0-1",
     "326f1a6d764adae4ccdc606913ba60b3aecc62788c509444751e7fea75a13584"),
    ("libva2", "2.17.0-1",
     "b737136a783067f8f202115ed820d955aea16b95a6f06c406cc4305f99d20d3e"),
    ("libvdpau1", "1.5-2",
     "2f13f0bce02b7c5c5caecf5522e22852e296d93b2275c6a445dbf5427605b93c"),
    ("libvidstab1.1", "1.1.0-2+b1",
     "39a88b11d1c727f43a4301d8408dfcbde2d6980e4d6295fe9f9f0447c9436971"),
    ("libvorbis0a", "1.3.7-1",
     "2f902ae456bcada7b0d494d7bd7c994feb81c4158209d8a12c0b2d9e255edda7"),
    ("libvorbisenc2", "1.3.7-1",
     "f1089e220c81e267caec859bf2e440bb78ed9f318bbb51cfd6c85d35bf80144b"),
    ("libvorbisfile3", "1.3.7-1",
     "f8f418e15f99905d4a2d532617511a11d700e814f8ead1a883deea2f7241970c"),
    ("libvpx7", "1.12.0-1+deb12u5",
     "4932b9515748ca48311e00ca548741aef7822300c9c149c400fd0a7cb0b6c394"),
    ("libvulkan1", "1.3.239.0-1",
     "3a21d49fef3a9799a21ffd5faa5bd7a1bd35604417cd9f5cf74155afd3b5282e"),
    ("libwayland-client0", "1.21.0-1",
     "ae390cc04c2eb1de90b9a6373505b22c730ada5e72daa50c507b7f99c12faf06"),
    ("libwayland-cursor0", "1.21.0-1",
     "8c8d1a3942bc3fc9dd3ea7c679c1a314e59cdaaa700883d54d1bb3ec89db256b"),
    ("libwayland-egl1", "1.21.0-1",
     "c08124a4d9af24f058b45c88867a84697882e755ea94965795d152fe26fe57c9"),
    ("libwayland-server0", "1.21.0-1",
     "4d99e7e0503fdaa999e67d47d8612c0465e775eafa47819573da50bdb09064f2"),
    ("libwebp7", "1.2.4-0.2+deb12u1",
     "7aafdb66662df9e1f68c80980fe3567bd29f93a03677d0cf408c21ce49da29ff"),
    ("libwebpmux3", "1.2.4-0.2+deb12u1",
     "e2780b058ecf06261ee1b7788307e56537dceb1da538cfd7fa44f379c12186e3"),
    ("libx11-6", "2:1.8.4-2+deb12u2",
     "d1d533e983582282a9ea82c87ac5ce715a9b67bd6d1acbd2439a11c63c36549b"),
    ("libx11-xcb1", "2:1.8.4-2+deb12u2",
     "21c7e6f19909bb1e02bb3c2089789791858c54d37e86cef9d7872782c1cb711e"),
    ("libx264-164", "2:0.164.3095+gitbaee400-3",
     "95475856611f971affe2dfaccc85253d1c6bb2fcb1d67c3147b32021cf304b8e"),
    ("libx265-199", "3.5-2+b1",
     "3142b9c9fb005013cee57abee51abbd78ca0a693fc61aa252fefd5be5d074b03"),
    ("libxau6", "1:1.0.9-1",
     "36c2bf400641a80521093771dc2562c903df4065f9eb03add50d90564337ea6c"),
    ("libxcb-dri3-0", "1.15-1",
     "a4b2a700d0da1dcaddc6435986d2ae45e8efdb58a2892a2e87cebb0c85dca359"),
    ("libxcb-render0", "1.15-1",
     "8d431caeae9dd0f7490caef1d66de0b7a7d3817afe021b6d55bedbba7b19bf43"),
    ("libxcb-shape0", "1.15-1",
     "8fd520c537f00cc5d29ff3ef4417d1182c4a7475c5d5c0998f137a9f52eb02a5"),
    ("libxcb-shm0", "1.15-1",
     "825931950d42f51cd795cf2e5b9399d840225491e95ec530e0c5a9145c4ba5a0"),
    ("libxcb-xfixes0", "1.15-1",
     "e6cfc1f2a68d4c7f0c10e8bf24ebab20d791ba96ec1ca70824ccd927f0fa9e21"),
    ("libxcb1", "1.15-1",
     "041d9a68415c3ccf3ce8f4f8b88e4bbfb5dc1f0d97013c6ef8423e620ea50f84"),
    ("libxcursor1", "1:1.2.1-1",
     "a93dd172bdd940de4ac6fd2b7a3f0213604c975f9f2f51eb3013f50886aaa87c"),
    ("libxdmcp6", "1:1.1.2-3",
     "e92569ac33247261aa09adfadc34ced3994ac301cf8b58de415a2d5dbf15ccfc"),
    ("libxext6", "2:1.3.4-1+b1",
     "5e9c0ad606eb4674c645fe8e0e64330c47d2729f7a59ed569848610efd5d5b62"),
    ("libxfixes3", "1:6.0.0-2",
     "d47bda8fed01b19b41d503e2df05d9166c58e30e2376f2f8784ceb7a834befe6"),
    ("libxi6", "2:1.8-1+b1",
     "b26383c9929d8bfba051eee22301e064d17039ed022bbf31990feb0d7a03b36c"),
    ("libxkbcommon0", "1.5.0-1",
     "ec518d8a19796a399ab95e7bc4dfbb6bd2ed8e151f77b222df26208db412d852"),
    ("libxml2", "2.9.14+dfsg-1.3~deb12u6",
     "0bc00975e459387535a4bbabe98a398f0e77c9ab82474face18d01ae8ed0dae4"),
    ("libxrandr2", "2:1.5.2-2+b1",
     "f0bc7f79fee182caae176652fdb1bf349d13b9591b10ad4dc1c896521da8e49f"),
    ("libxrender1", "1:0.9.10-1.1",
     "f260193deb4eaf0b410a1c61e1f84804366ee3372b8bad9f38005f7dbcd89aae"),
    ("libxss1", "1:1.2.3-1",
     "e0ff80e309eacda5face68b9a3bd56718fed2750af429324c35d7c9491c335f4"),
    ("libxv1", "2:1.0.11-1.1",
     "61d831c3094903a9afe7cd148615d522f84254ccf952d28a68550d3d1ff9c964"),
    ("libxvidcore4", "2:1.3.7-1",
     "b950edcb42803f158f94cd2ee44850082c98c92d54e20982ad933936f5f1d181"),
    ("libzimg2", "3.0.4+ds1-1",
     "407502547272e72490f7434c51a2c5c69fedcbd627ff06d17b7ffedea7e9c310"),
    ("libzmq5", "4.3.4-6",
     "f5e6f10a2e01b016369f2d1687d39ab5ed5e5ecdb6ca5fb248b6100a3a7069e9"),
    ("libzvbi0", "0.2.41-1+deb12u1",
     "b6fb4091ca76c31d5ea1113e6ff9c482227a516508a7bff1d9e4baa723f3b49e"),
    ("ocl-icd-libopencl1", "2.3.1-1",
     "a021fd47d5c0d802e4f688694dae4c1e3601cd8b651294df3d327a5e6fa72a72"),
)


def _find(root: Path, soname: str) -> Path | None:
    for d in _LIB_DIRS:
        path = root / d / soname
        if path.exists():
            return path
    return None


def closure(unpacked: Path, node_root: Path) -> dict[str, Path]:
    """soname -> file in ``unpacked`` for the FFmpeg 5 libraries and all they
    need (DT_NEEDED, transitively) that ``node_root`` does not have."""
    todo, found = list(FFMPEG5_SONAMES), {}
    while todo:
        soname = todo.pop()
        if soname in found or _find(node_root, soname) is not None:
            continue
        path = _find(unpacked, soname)
        if path is None:
            raise CorpusUnavailable(f"FFmpeg 5 closure: {soname} is in neither the pinned "
                                    "debs nor the node root (re-resolve FFMPEG5_PINS)")
        try:
            info = read_elf(str(path))
        except (OSError, ElfError) as exc:
            raise CorpusUnavailable(f"FFmpeg 5 closure: {path}: {exc}") from exc
        found[soname] = path
        todo += info.needed
    return found


def ffmpeg5_libs() -> Path:
    """A directory of FFmpeg 5.1's arm64 libraries and their closure, each
    under its soname (cached; the first build downloads 78 MB of debs)."""
    node_root = slurm_root()

    def build(work: Path) -> Path:
        debs = images.fetch_pinned_debs(work / "apt", SUITE, FFMPEG5_PINS, work / "debs")
        unpacked = work / "unpack"
        images._unpack(debs, unpacked)
        out = work / "root"
        (out / "lib").mkdir(parents=True)
        for soname, path in closure(unpacked, node_root).items():
            shutil.copyfile(path.resolve(), out / "lib" / soname)
        shutil.rmtree(unpacked)
        return out

    return _cached_tree("vm/ffmpeg5-bookworm-arm64",
                        {"pins": [list(p) for p in FFMPEG5_PINS],
                         "node": (node_root.parent / "stamp.json").read_text()},
                        build) / "lib"


def link_into(src: Path, dest: Path) -> None:
    """``dest`` gets every file of ``src`` as a hard link (the cache and the
    test's share are on one file system here), else a copy."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        try:
            os.link(path, dest / path.name)
        except OSError:
            shutil.copyfile(path, dest / path.name)
