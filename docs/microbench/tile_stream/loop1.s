	prefetcht1	-192(%r14)
	prefetcht1	-128(%r14)
	vpbroadcastd	(%r8,%r15), %zmm2
	vmovdqu64	-8384(%r14), %zmm3
	vmovdqu64	-8320(%r14), %zmm4
	prefetcht1	-64(%r14)
	vmovdqu64	-8256(%r14), %zmm5
	vmovdqu64	-8192(%r14), %zmm6
	vpandq	%zmm29, %zmm3, %zmm7
	vgf2p8affineqb	$0, %zmm30, %zmm3, %zmm3
	vpdpbusd	-28(%rdx,%r15,8){1to16}, %zmm7, %zmm2
	vpxor	%xmm7, %xmm7, %xmm7
	vpdpbusd	-12(%rdx,%r15,8){1to16}, %zmm3, %zmm7
	vpandq	%zmm29, %zmm4, %zmm3
	vgf2p8affineqb	$0, %zmm30, %zmm4, %zmm4
	vpdpbusd	-24(%rdx,%r15,8){1to16}, %zmm3, %zmm2
	vpdpbusd	-8(%rdx,%r15,8){1to16}, %zmm4, %zmm7
	vpandq	%zmm29, %zmm5, %zmm3
	vgf2p8affineqb	$0, %zmm30, %zmm5, %zmm4
	vpdpbusd	-20(%rdx,%r15,8){1to16}, %zmm3, %zmm2
	vpdpbusd	-4(%rdx,%r15,8){1to16}, %zmm4, %zmm7
	vpandq	%zmm29, %zmm6, %zmm3
	vgf2p8affineqb	$0, %zmm30, %zmm6, %zmm4
	vpdpbusd	-16(%rdx,%r15,8){1to16}, %zmm3, %zmm2
	vpdpbusd	(%rdx,%r15,8){1to16}, %zmm4, %zmm7
	prefetcht1	(%r14)
	vpaddd	%zmm2, %zmm7, %zmm2
	vpmovzxwd	(%r12,%r15,8), %zmm3
	vpslld	$16, %zmm3, %zmm3
	vcvtdq2ps	%zmm2, %zmm2
	vmulps	(%rdi,%r15){1to16}, %zmm2, %zmm2
	vfmadd231ps	%zmm2, %zmm3, %zmm0
	addq	$4, %r15
	addq	%r13, %r14
	decq	%r11
	jne	.LBB6_226
